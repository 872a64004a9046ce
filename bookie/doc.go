// Package bookie is the bookie process behind `ringkeeper bookie --conf FILE`: configuration
// (a BookKeeper-style properties file with BookKeeper's key names, flags over it), the storage
// engine (package engine), the network server (package net/server) and the bookie's place in
// the metadata service.
//
// # Lifecycle
//
// Start: connect to the metadata service; check the cookies in every journal and ledger
// directory against each other and against the one in the metadata service (a missing or
// different cookie stops the bookie with what to do, never an empty start on a wiped disk);
// open the engine, which replays the journal from the LastLogMark and checkpoints; start
// serving; only then register, writable or read-only. Close (SIGTERM): deregister, stop
// accepting and drain the server, close the engine (a final checkpoint).
//
// # Disk usage
//
// Every diskCheckInterval: above diskUsageThreshold the bookie turns read-only (adds get
// EREADONLY except high-priority ones, which recovery sends, while space remains; reads go
// on) and its registration moves to read-only; below diskUsageLwmThreshold it turns writable
// again.
// Below one entry log of free space the engine refuses every add. A full disk therefore ends
// in clean refusals, never in a torn write that was acknowledged.
// The same check finds failed storage (a write or fsync error, sticky in the engine and the
// journals): the bookie then turns read-only until restart, whatever the disk usage or an
// operator says (the admin API answers 409), so that clients stop picking a bookie where
// every add fails; reads go on. GET /api/v1/bookie/state says storageFailed.
//
// # HTTP
//
// On prometheusStatsHttpPort: /metrics (Prometheus, BookKeeper's metric names where the
// meaning is the same), /heartbeat, and the admin API: /api/v1/bookie/state, PUT
// /api/v1/bookie/state/readonly, /api/v1/bookie/info, and the garbage-collection routes
// (gc.go). httpServerEnabled=false leaves the admin API out. Unlike BookKeeper, whose default
// is false, ringkeeper serves it unless told not to: `ringkeeper shell gc` drives bookies
// through it, a standalone cluster's included. The admin API has no authentication: turn it
// off, or keep the port off untrusted networks.
//
// # Configuration
//
// Keys mean what they mean in BookKeeper: listeningInterface names a network interface (eth0)
// whose first IPv4 address the bookie binds and, without advertisedAddress, names in its id;
// the deprecated journalDirectory counts only when journalDirectories is not set. Journal and
// ledger dirs are made absolute before the cookies record them, and one named twice is a
// configuration error (a journal dir may also be a ledger dir). httpServerEnabled defaults to
// true here (see HTTP). maxUnwrittenReadBytes, ringkeeper's own (default 128 MiB), bounds the
// read responses the bookie holds, over all connections, that clients have not yet taken off
// their sockets; a read over it is answered ETOOMANYREQUESTS (net/server's package doc).
package bookie
