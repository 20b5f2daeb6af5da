"""The cluster launcher behind `scripts/launch.py`: hosts, transports, the per-host guard and the job itself."""
