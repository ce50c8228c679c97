// Stop requests (SIGTERM, SIGINT) for a daemon's main thread, whichever thread the kernel hands
// them to.
//
// Blocking them and sigwait()ing in main is not enough: threads that exist before main runs do
// not block them (OpenBLAS starts its pool when the library loads, and every cofab binary links
// it through cofab::coding), so the kernel may deliver the signal there, where its default action
// ends the process at once: a daemon stopping "gracefully" died by SIGTERM, and one stopped
// during startup could not say so. Here a handler, installed for the whole process, writes the
// signal's number to a pipe that the main thread reads; and install() makes the threads that
// already exist block the signals too (each from inside itself, through a real-time signal), so
// that a stop signal waits on the process for the main thread and pending() sees it at once.
#pragma once

#include <cstdint>
#include <functional>

#include "core/clock.h"
#include "core/status.h"

namespace cofab {

class StopSignals {
 public:
  // A stop signal the process was started with ignored stays ignored (and is never reported):
  // `cofab-store &` in a script survives a Ctrl-C meant for the script's foreground command.
  // Blocks SIGTERM and SIGINT in the calling thread (threads it starts later inherit that, so
  // their system calls are not interrupted) and in every thread already running (best effort,
  // at most 1 s: uses SIGRTMIN+5 unless something else handles it, and its handler stays
  // installed; a wait in such a thread may see one EINTR), and installs the handlers.
  // Call it early in main, before starting threads; later calls do nothing more.
  static void install();
  // The number of a stop signal received so far (consumed), or 0; does not block. Once every
  // thread blocks them (install() could mask each older thread), any signal sent before the
  // call is seen; otherwise one may show only a moment later.
  static int pending();
  // Blocks until a stop signal arrives (or one already did); its number.
  static int wait();
};

// The slice for a startup wait whose attempt opens a store connection: a TCP store's connect
// gives each resolved address up to 2 s (fabric/rendezvous/tcp_socket.cc), so the default 200 ms
// slice cut every attempt short of a store whose first address drops SYNs (a firewalled IPv6
// record) or whose round trip is 200 ms or more, and the daemon gave up on a store the workers
// reached. A stop request during it waits at most this long.
inline constexpr int64_t kStoreConnectSliceMs = 5000;

// A startup wait that a stop request ends early: runs attempt(sliceDeadline) in slices of at
// most `sliceMs` until it gives anything but DeadlineExceeded or `deadline` passes, and looks
// for a stop request (StopSignals::pending()) after each slice. On one, *stopped is its number
// and the last attempt's result is returned; otherwise *stopped is 0. Daemons use it so that one
// stopped while starting exits before it advertises itself. An attempt that must finish within
// one slice (a connect: a slice's end abandons its handshake) needs a slice much longer than
// one attempt takes.
template <typename T>
StatusOr<T> untilStopped(const std::function<StatusOr<T>(Deadline)>& attempt, Deadline deadline,
                         int* stopped, int64_t sliceMs = 200) {
  *stopped = 0;
  while (true) {
    StatusOr<T> r = attempt(Deadline::afterMs(sliceMs).min(deadline));
    if ((*stopped = StopSignals::pending()) != 0) return r;
    if (r.ok() || r.status().code() != StatusCode::kDeadlineExceeded || deadline.expired()) {
      return r;
    }
  }
}

}  // namespace cofab
