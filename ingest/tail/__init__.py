"""Follow a log file onto ``events.logs``, resumable across restarts and rotations.

- :mod:`ingest.tail.state`: the persisted position and its atomic state file;
- :mod:`ingest.tail.follower`: polling reader that survives rotation and truncation;
- :mod:`ingest.tail.tailer`: parse, join stack traces, publish, save the acknowledged position.
"""
