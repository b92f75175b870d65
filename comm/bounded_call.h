// run_bounded: a call into a library whose waits we cannot bound (Note
// [Bounding what the libraries do not]).
//
// Note [Bounding what the libraries do not]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Gloo's pairs wait five times the configured timeout for a peer to
// connect, and the side that listens waits for a peer that failed to
// connect to it until that deadline (issue 42: rank 1 hung past an outside
// `timeout 60` with --timeout-s=15); c10d's store calls block on a peer that
// stopped answering. So the rendezvous and the connection of a multi-process
// world run on a thread of their own, which the rank waits for at most the
// configured timeout. If the call has not returned by then, the rank throws
// CommError, saying what the call was waiting for, and leaves the thread
// behind, detached, still blocked: the process is expected to end (a world
// that cannot connect is rebuilt, not repaired), and the thread owns
// (shares) everything it touches, so nothing it may still use goes away
// under it.
//
// Thread safety: run_bounded may be called from any thread.
#ifndef ZEROSTEP_COMM_BOUNDED_CALL_H_
#define ZEROSTEP_COMM_BOUNDED_CALL_H_

#include <chrono>
#include <functional>
#include <string>

namespace zerostep {

// Runs `fn` on a new thread and waits at most `timeout` for it. Returns
// when fn returns; rethrows what fn throws; if fn is still running at the
// timeout, throws CommError(on_timeout()) and detaches the thread (fn must
// own, by value or shared pointer, everything it uses). `on_timeout` runs
// on the calling thread.
void run_bounded(std::function<void()> fn, std::chrono::milliseconds timeout,
                 const std::function<std::string()>& on_timeout);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_BOUNDED_CALL_H_
