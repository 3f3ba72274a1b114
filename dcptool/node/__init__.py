"""dcptool's reference node: a memcached binary protocol server with vbuckets, durable
storage and a DCP producer, wire-compatible with real Couchbase clients.

Layout (one module per concern, mini-redis style):

* `server`: the process (warm-up, listening, shutdown); `connection`: one client;
* `commands/`: one module per command family (session, kv, meta, stats, cluster, dcp);
* `bucket`, `vbucket`, `item`: the data (a node holds many buckets; `bucketset`: their
  settings, layout and registry; `restbuckets`: creating, editing and dropping them over
  REST); `checkpoint`: in-memory change queues and cursors;
* `storage`: SQLite in WAL mode and the flusher thread; `backfill`: disk-backfill admission;
* `producer`, `stream`: the DCP producer and its streams (frames built with
  `dcptool.protocol.wire`);
* `decisions`: the seeds' rules as pure functions; `auth`, `errormap`, `status`, `config`.
"""
