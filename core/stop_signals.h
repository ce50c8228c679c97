// Stop requests (SIGTERM, SIGINT) for a daemon's main thread, whichever thread the kernel hands
// them to.
//
// Blocking them and sigwait()ing in main is not enough: threads that exist before main runs do
// not block them (OpenBLAS starts its pool when the library loads, and every cofab binary links
// it through cofab::coding), so the kernel may deliver the signal there, where its default action
// ends the process at once: a daemon stopping "gracefully" died by SIGTERM, and one stopped
// during startup could not say so. Here a handler, installed for the whole process, writes the
// signal's number to a pipe that the main thread reads.
#pragma once

namespace cofab {

class StopSignals {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread (threads it starts later inherit that, so
  // their system calls are not interrupted) and installs the handlers. Call it early in main,
  // before starting threads; later calls do nothing more.
  static void install();
  // The number of a stop signal received so far (consumed), or 0; does not block.
  static int pending();
  // Blocks until a stop signal arrives (or one already did); its number.
  static int wait();
};

}  // namespace cofab
