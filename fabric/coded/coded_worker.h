// CodedWorker: one worker process of the coded task service (fabric/coded/coded_master.h).
//
// runCodedWorker() finds the master's address in the rendezvous store (key "<name>/master"),
// connects, registers as worker `index`, receives its block of A once, then serves requests
// until the master says shutdown (returns OK) or the connection fails (returns the error).
//
// A request is: wait the injected delay (a ShiftedExponentialDelay drawn from (request, index),
// parameters sent by the master), then block x B, row block by row block. A cancel for the
// request interrupts the delay at once and the product between row blocks; the worker then
// answers with a cancel report saying where it stopped (queued / delaying / computing k of m
// row blocks / already finished), so that the master can show cancellation really stops work.
//
// Threads: the calling thread computes; the transport's I/O thread receives and handles cancels
// (they must not wait behind the computation they cancel). Everything is owned by the call.
#pragma once

#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/rendezvous/store.h"

namespace cofab::coded {

struct CodedWorkerOptions {
  Store* store = nullptr;  // borrowed for the call
  std::string name = "cofab-coded";
  int index = -1;  // worker index in [0, n)
  std::string transport = "tcp";
  Duration setupTimeout{0};  // 0: COFAB_CODED_SETUP_TIMEOUT_MS
};

Status runCodedWorker(const CodedWorkerOptions& options);

}  // namespace cofab::coded
