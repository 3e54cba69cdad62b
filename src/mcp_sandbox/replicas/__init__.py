"""Replicas of one service: the workspaces they share through S3-compatible object storage."""
