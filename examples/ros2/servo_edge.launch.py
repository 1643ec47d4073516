"""servo-edge beside the arm's ROS 2 driver: ``ros2 launch servo_edge.launch.py`` on the robot's computer.

The driver is ros2_control with a forward position controller (``controllers.yaml`` is the arm's
own); servo-edge is one more process beside it, running the command ``servo-serve
examples/ros2/manifest.toml`` prints for the arm (docs/guides/ros2.md), with ``gpu-server`` the
server's address and the join token it printed (proved once: the robot keeps its enrolment and
the server's identity). servo-edge needs no ROS install: the launch file only starts it.
"""

from launch import LaunchDescription
from launch.actions import ExecuteProcess
from launch_ros.actions import Node

#: The arm's command, as servo-serve prints it (--no-status: no live status line in a launch log).
EDGE = (
    "servo-edge --robot ros2"
    " --robot-opt joints=shoulder_pan.pos=shoulder_pan_joint,shoulder_lift.pos=shoulder_lift_joint,"
    "elbow_flex.pos=elbow_joint,wrist_flex.pos=wrist_1_joint,wrist_roll.pos=wrist_2_joint,gripper.pos=gripper_joint"
    " --robot-opt urdf=examples/ros2/arm.urdf --robot-opt rest_pose=0,-1.57,1.57,0,0,10"
    " --robot-opt units=degrees,degrees,degrees,degrees,degrees,raw"
    " --robot-opt command_topic=/forward_position_controller/commands"
    " --robot-opt command_type=std_msgs/Float64MultiArray"
    " --robot-opt cameras=front:/camera/image_raw/compressed:320x240"
    " --connect tls/gpu-server:7447 --join servo-join-v1.… --no-status"
)


def generate_launch_description() -> LaunchDescription:
    """The driver, its controller, and servo-edge."""
    return LaunchDescription(
        [
            Node(package="controller_manager", executable="ros2_control_node", parameters=["controllers.yaml"]),
            Node(package="controller_manager", executable="spawner", arguments=["forward_position_controller"]),
            ExecuteProcess(cmd=EDGE.split(), output="screen"),
        ]
    )
