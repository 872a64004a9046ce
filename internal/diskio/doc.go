// Package diskio is the one seam for data-file I/O in ringkeeper.
//
// Every journal, entry-log and mark file is opened through an FS. Two implementations exist:
//
//   - OS: real files. Data files are opened with O_DIRECT; buffers, offsets and lengths must then
//     be aligned to Alignment (read from statx STATX_DIOALIGN, 4096 when unknown). Aligned buffers
//     come from a Slab (mmap'd memory, so the garbage collector never moves or frees memory that
//     the kernel is still writing from).
//   - Mem: an in-memory file system for tests that tracks what has been synced. Crash returns the
//     state a power loss could leave behind (only synced data and synced directory entries, plus
//     optionally a random prefix or subset of what was not synced), and an injector can fail the
//     k-th write or sync with EIO.
//
// Durable appends go through a WriteSyncer: "write this buffer at this offset, then fdatasync",
// with several such pairs in flight so that one group's write overlaps the previous group's sync.
// The io_uring engine submits each pair from the caller's goroutine as two linked SQEs
// (write_fixed → fdatasync), or one write with RWF_DSYNC, and a completer goroutine parked in
// the netpoller on the ring's eventfd reaps them; the psync engine runs pwrite+fdatasync pairs
// on a small pool of goroutines. Completions are reported in any order and carry the caller's
// id; callers that need order (the journal) re-order them.
//
// Reads (File.ReadAt of OS files) go through one io_uring shared by the process wherever io_uring
// is available, pread otherwise: the reader that finds no other reader submitting submits every
// read queued so far with one io_uring_enter, and a completer goroutine parked in the netpoller
// on an eventfd wakes each reader. A blocking pread would hold its goroutine's P until the
// scheduler noticed, which with few cores serialises concurrent cold reads (see uringreader.go
// and BENCHMARKS.md).
//
// Engines: "io_uring" requires a working io_uring (it can be disabled by seccomp or
// kernel.io_uring_disabled); "psync" always works; "auto" picks io_uring when it is available.
package diskio
