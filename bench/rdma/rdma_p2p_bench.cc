// rdma point-to-point bench: one-way latency (half a ping-pong round trip) and streaming goodput
// between two rdma contexts of this process, for a range of message sizes.
//
//   cofab-rdma-bench [--real] [--iters N] [--sizes 8,4096,...]
//
// Default binding: the verbs emulation (tests/support/verbs_emulation.h), a test double — its
// figures say nothing about RDMA hardware and every RESULT line says binding=emulated. With
// --real the contexts use libibverbs.so.1 and the device chosen by COFAB_IB_DEVICE/PORT/GID_INDEX
// (both ends on the same device: traffic loops through the NIC). Ends with lines
//   RESULT rdma_p2p binding=<emulated|real> bytes=N lat_us=X goodput_gbit_s=Y
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "bench/support/result_reporter.h"
#include "fabric/transport/rdma/factory.h"
#include "tests/support/verbs_emulation.h"

namespace cofab {
namespace {

using transport::Connection;

// Counts completions; wait() blocks until `n` arrived (or fails after 60 s).
struct Counter {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  Status first;
  void add(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok() && first.ok()) first = s;
    ++done;
    cv.notify_all();
  }
  Status wait(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(60), [&] { return done >= n; })) {
      return DeadlineExceeded("bench: completions did not arrive within 60 s");
    }
    return first;
  }
};

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Status run(bool real, int iters, const std::vector<size_t>& sizes) {
  transport::rdma::RdmaOptions o;
  if (!real) o.verbs = &testing::emulatedVerbs();
  COFAB_ASSIGN_OR_RETURN(auto server, transport::rdma::createContext({.localId = "server"}, o));
  COFAB_ASSIGN_OR_RETURN(auto client, transport::rdma::createContext({.localId = "client"}, o));
  COFAB_ASSIGN_OR_RETURN(auto listener, server->listen({}));
  COFAB_ASSIGN_OR_RETURN(auto a, client->connect(listener->address(), {.localId = "bench"},
                                                 Deadline::afterMs(20000)));
  COFAB_ASSIGN_OR_RETURN(auto b, listener->accept(Deadline::afterMs(20000)));
  const char* binding = real ? "real" : "emulated";
  for (size_t size : sizes) {
    std::vector<uint8_t> src(size, 0x5a), dst(size);
    const wire::Header h;
    // Latency: ping-pong, the server echoes from its callbacks.
    const int pingIters = std::max(1, size >= (1u << 20) ? iters / 10 : iters);
    Counter pongs;
    std::function<void(int)> echo = [&](int left) {
      if (left == 0) return;
      b->recv(dst.data(), size, [&, left](const Status& s, const wire::Header&) {
        if (!s.ok()) return pongs.add(s);
        b->send(h, dst.data(), size, [&, left](const Status& s2) {
          if (!s2.ok()) return pongs.add(s2);
          echo(left - 1);
        });
      });
    };
    echo(pingIters);
    std::vector<uint8_t> back(size);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pingIters; ++i) {
      Counter one;
      a->recv(back.data(), size, [&](const Status& s, const wire::Header&) { one.add(s); });
      a->send(h, src.data(), size, [&](const Status& s) { one.add(s); });
      COFAB_RETURN_IF_ERROR(one.wait(2));
    }
    const double latUs = seconds(std::chrono::steady_clock::now() - t0) / pingIters / 2 * 1e6;
    // Goodput: a window of sends in flight, receives posted ahead.
    const int streamMsgs = std::max(8, static_cast<int>(std::min<size_t>(
                                           4096, (size_t{256} << 20) / std::max<size_t>(size, 1))));
    Counter sent, got;
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < streamMsgs; ++i) {
      b->recv(dst.data(), size, [&](const Status& s, const wire::Header&) { got.add(s); });
    }
    for (int i = 0; i < streamMsgs; ++i) {
      a->send(h, src.data(), size, [&](const Status& s) { sent.add(s); });
    }
    COFAB_RETURN_IF_ERROR(sent.wait(streamMsgs));
    COFAB_RETURN_IF_ERROR(got.wait(streamMsgs));
    const double secs = seconds(std::chrono::steady_clock::now() - t1);
    const double gbit = static_cast<double>(size) * streamMsgs * 8 / secs / 1e9;
    std::printf("%-9s %10zu bytes  latency %10.2f us  goodput %8.3f Gbit/s\n", binding, size,
                latUs, gbit);
    bench::printResult("rdma_p2p", {{"binding", binding},
                                    {"bytes", std::to_string(size)},
                                    {"lat_us", bench::num(latUs)},
                                    {"goodput_gbit_s", bench::num(gbit)}});
  }
  a->close();
  b->close();
  client->join();
  server->join();
  return OkStatus();
}

}  // namespace
}  // namespace cofab

int main(int argc, char** argv) {
  bool real = false;
  int iters = 2000;
  std::vector<size_t> sizes = {8, 4096, 65536, 1 << 20, 16 << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--real") {
      real = true;
    } else if (arg == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      size_t pos = 0;
      while (pos < list.size()) {
        const size_t comma = list.find(',', pos);
        sizes.push_back(std::stoull(list.substr(pos, comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--real] [--iters N] [--sizes a,b,c]\n", argv[0]);
      return 2;
    }
  }
  if (!real) {
    std::printf("binding: verbs EMULATION (test double): figures are NOT RDMA hardware figures\n");
  }
  cofab::Status s = cofab::run(real, iters, sizes);
  if (!s.ok()) {
    std::fprintf(stderr, "cofab-rdma-bench: %s\n", s.toString().c_str());
    return s.code() == cofab::StatusCode::kUnavailable ? 77 : 1;
  }
  return 0;
}
