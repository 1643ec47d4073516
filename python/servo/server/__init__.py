"""The policy server: one model on one device, serving many robots over Zenoh."""
