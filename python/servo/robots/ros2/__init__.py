"""ROS 2 robots over DDS (``--robot ros2``): joint states in, slew-limited targets out, no rclpy."""
