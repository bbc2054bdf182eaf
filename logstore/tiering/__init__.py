"""Tiered storage: sealed segments copied to an fsspec URL, remote segment metadata in the
cluster metadata store, remote reads by brokers and projected reads by Spark executors.

| module            | what the broker (or an executor) uses                                  |
|-------------------|------------------------------------------------------------------------|
| store.py          | ObjectStore (the seam), RemoteStorageError                             |
| fsspec_store.py   | FsspecObjectStore(remote_storage_uri, remote_storage_options)          |
|                   | (ensure_root: create the bucket or directory, for demos and tests)     |
| metadata.py       | RemoteLogSegmentMetadata, TopicIdPartition, the state rules            |
| naming.py         | object keys                                                            |
| rules.py          | what to copy, what to delete, lineage, orphans (pure)                  |
| log_view.py       | TieredLog, LogTierView(log, epoch_entries, last_stable_offset, config),|
|                   | local_log_config(config): a tiered Log's config (no total retention)   |
| tier_manager.py   | RemoteLogManager: on_become_leader / on_stop_leading / start / close,  |
|                   | find_remote_segment, log_start_offset, leader_epoch, stats,            |
|                   | cleanup_deleted_topics                                                 |
| remote_cache.py   | RemoteIndexCache (disk), ChunkCache (memory, single flight)            |
| remote_reader.py  | RemoteLogReader.read / submit / read_many / collect_aborted;           |
|                   | scan_segment (whole CRC-checked batches, for executors)                |
| projection.py     | ProjectedSegmentReader.read(columns, start, end) for executors         |

The broker side (``broker/remote_tier.py``) builds these from the broker config; Spark's
executors use ``FsspecObjectStore``, ``ProjectedSegmentReader`` and ``scan_segment`` directly.
"""
