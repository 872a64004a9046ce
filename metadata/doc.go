// Package metadata is ringkeeper's metadata service: the bookie registry,
// ledger metadata with compare-and-set, ledger id generation, cookies and the
// cluster instance id, behind one small driver interface.
//
// # Drivers
//
// [Driver] is the seam: callers (bookie, client, tools) use only the
// interfaces here ([Driver], [Registry], [Registration], [LedgerStore],
// [CookieStore]) and open a driver by URI with [Open]. A driver package
// registers its URI scheme from init; today there is one,
// github.com/ringkeeper/ringkeeper/metadata/etcd ("etcd://"), which talks to
// an external etcd cluster or to the in-process server of
// metadata/embedded. A ZooKeeper driver ("zk://") would register the same
// way, without changes to callers.
//
// URIs have the form scheme://host[:port][,host[:port]...]/root, for example
// etcd://10.0.0.1:2379,10.0.0.2:2379/ledgers. [ParseURI] is strict: a
// malformed URI fails with [ErrBadURI] and says what is wrong. [Open] waits
// for the service to answer and fails with [ErrUnreachable] after
// [Options].DialTimeout.
//
// # Versions and compare-and-set
//
// Every read of ledger metadata or of a cookie returns a [Version]; every
// update and delete names the version it expects and fails with a
// [*BadVersionError] (errors.Is [ErrBadVersion]) if another writer got there
// first. For ledgers the error carries the metadata now stored and its
// version, so [UpdateLedger] can retry a read-modify-write loop without
// reading again. The etcd driver's versions are the keys' ModRevisions, and
// every write is a transaction comparing it. [NoVersion] as the expected
// version means "must not exist yet"; [AnyVersion] means "unconditional".
//
// # Key layout (etcd)
//
// All keys live under the root path of the URI ("/ledgers" below). Every
// value format is versioned.
//
//	<root>/ledgers/<id>             ledger metadata, id as 19 zero-padded
//	                                decimal digits (0000000000000000042), so
//	                                key order is id order and a range read
//	                                pages through ledgers in id order
//	<root>/bookies/writable/<id>    registration of a writable bookie
//	<root>/bookies/readonly/<id>    registration of a read-only bookie;
//	                                <id> is the bookie id (host:port); each
//	                                is bound to the bookie's lease; at most
//	                                one of the two exists per bookie
//	<root>/cookies/<id>             the bookie's cookie (bytes owned by the
//	                                bookie package)
//	<root>/instanceid               the cluster instance id (a UUID string),
//	                                created once by the first caller
//	<root>/idgen                    the ledger id counter (decimal ASCII)
//	<root>/kv/<key>                 the KV keyspace ([KV]): values owned by the
//	                                layers above ledgers (package dlog)
//	<root>/locks/<name>/<lease>     KV locks: one key per contender, bound to
//	                                its lease; the oldest holds the lock
//	                                (etcd's concurrency.Mutex); <name> is
//	                                path-escaped, so one lock's keys never
//	                                fall under another's prefix
//
// BookKeeper's own etcd driver uses the same shape (<scope>/ledgers,
// <scope>/bookies/{writable,readonly}, <scope>/cookies, <scope>/instanceid),
// but names ledgers by a UUID built from the id and allocates ids in
// buckets.
//
// # KV keyspace and locks
//
// [KV] is an optional capability ([KVOf]) for layers built on ledgers: Get,
// paged List by prefix, Commit of up to [MaxKVOps] puts and deletes in one
// transaction, each with an expected version, optionally guarded by a held
// [Lock] (the commit then also requires the lock's key to be the one this
// holder created, so a holder whose lease expired cannot write), prefix
// Watch, and lease-based locks. The etcd driver implements it.
//
// # Ledger ids
//
// Ids are 64-bit (0 to 2^63-1). The idgen key holds the first id that no
// client has reserved. A driver reserves a batch of [Options].IDBatchSize
// ids by moving the counter forward with a transaction that compares its
// ModRevision with the one it read (retrying on conflict), then hands the
// ids out locally. Two clients never reserve overlapping ranges, and the
// counter never moves back, so an id is never handed out twice, not even
// after its ledger is deleted. Ids that a driver reserved but did not hand
// out before it closed are skipped.
//
// A missing idgen key starts at 0 on a new cluster. If ledgers exist (the key
// was deleted by hand, or a restore left it out), the driver that finds it
// missing reads the largest ledger key, once, and starts the counter at the
// id after it, so the ids of existing ledgers, and of deleted ledgers below
// the largest, are not handed out again (bookies may still hold their
// entries, fencing state and tombstones until garbage collection). Ids of
// deleted ledgers above the largest remaining one are indistinguishable from
// unused ids and can be handed out again: the key must not be deleted. If
// the last key under <root>/ledgers/ is not a ledger id, the start is
// unknown, and the driver fails with [ErrCorruptMetadata] rather than guess.
// [CreateLedger] never reuses the id of an existing ledger in any case: the
// create is conditional on the key not existing, and on a conflict (an id
// written with an explicit id, or by a driver still holding a batch reserved
// before the key was lost) it takes the next id.
//
// # Ledger metadata encoding, format version 1
//
// [BinaryCodec] (the default [Codec]) stores [LedgerMetadata] as below. All
// integers are big-endian; lengths count bytes.
//
//	offset  size  field
//	0       4     magic "RKLM" (52 4B 4C 4D)
//	4       2     format version, uint16 = 1
//	6       4     body length N, uint32
//	10      N     body
//	10+N    4     CRC32C (Castagnoli) of bytes [0, 10+N)
//
// Body of version 1:
//
//	size      field
//	1         state: 1 OPEN, 2 IN_RECOVERY, 3 CLOSED
//	1         digest type: 1 CRC32, 2 HMAC, 3 CRC32C, 4 DUMMY
//	2         ensemble size E, uint16
//	2         write quorum Qw, uint16
//	2         ack quorum Qa, uint16
//	8         last entry id, int64 (-1 while not CLOSED, and for an empty
//	          CLOSED ledger)
//	8         length in bytes, int64 (0 unless CLOSED)
//	8         creation time, int64 milliseconds since the Unix epoch
//	          (0 = unknown)
//	2 + P     password: uint16 length P, then P bytes
//	4         ensemble count S, uint32; then S ensembles, in increasing
//	          first entry id:
//	            8          first entry id, int64
//	            E x (2+L)  bookie ids: uint16 length L, then L bytes
//	4         custom metadata count C, uint32; then C pairs in strictly
//	          increasing key order:
//	            2 + K      key: uint16 length K, then K bytes
//	            4 + V      value: uint32 length V, then V bytes
//
// The body must be consumed exactly. Decoding checks magic, version, length
// and checksum, bounds every count by the bytes left (corrupt input cannot
// make it allocate more than its own size), and then runs
// [LedgerMetadata.Validate]. Corrupt input gives an error wrapping
// [ErrCorruptMetadata]; an unknown format version, or BookKeeper's own
// "BookieMetadataFormatVersion\t" text header, gives [ErrUnsupportedFormat].
// Decoding never panics (FuzzDecodeLedgerMetadata). Encoding is
// deterministic. A new field means a new format version; versions only move
// forward. A BookKeeper-compatible codec (LedgerMetadataFormat v3: the
// header line, then a varint-length-delimited protobuf) can be given to a
// driver as [Options].Codec.
//
// # Bookie registration value
//
// A registration's value is JSON, {"v":1, "endpoints":[{"id", "protocol",
// "host", "port", "auth"}], "freeDiskBytes", "totalDiskBytes",
// "properties"} ([EncodeBookieInfo]); the bookie id and state come from the
// key. "v" is the value's format version.
//
// # Liveness
//
// A bookie registers with a lease of a TTL ([DefaultRegistrationTTL] unless
// given) and keeps it alive from a goroutine. If its process dies, the lease
// expires and etcd deletes the registration within about the TTL plus half a
// second. If the lease is lost while the process lives (a long pause, a
// partition), the registration is made again under a new lease: the key
// moves from the old lease to the new one in one transaction, even if etcd
// still holds the old lease alive, and only then is the old lease revoked
// (best effort), so a healthy bookie never drops out of the registry waiting
// for its own old lease. A second
// process registering an id that a live lease holds waits for that lease to
// expire (a restarted bookie whose previous process crashed), and fails with
// [ErrBookieExists] if it does not.
package metadata
