// dpdk_p2p_bench: point-to-point goodput (1 MiB messages, 1500-byte frames) and 64-byte round
// trip of the dpdk transport over memif between two processes, next to a raw DPDK memif
// sender/receiver and the tcp transport (127.0.0.1), all in one run. Each side of each case is a
// forked process (one EAL per process; the server on lcore 1, the client on lcore 0).
//
//   build/bench/dpdk/dpdk_p2p_bench [seconds per case, default 2] [idle spin us, default 50]
//                                   [cases, default raw,dpdk,lossy,tcp,busy,crc,zc]
//
// The dpdk pollers use the library's idle policy (spin 50 us, then nap) unless told otherwise
// (-1: busy-poll); one more lossless case always busy-polls, for comparison.
//
// Ends with: RESULT dpdk_p2p frame=1500 goodput_gbps=... raw_gbps=... tcp_gbps=...
//            rtt_p50_us=... tcp_rtt_p50_us=... lossy10_goodput_gbps=...
// (and RESULT dpdk_p2p_ratios, dpdk_p2p_cost, dpdk_p2p_zero_copy lines)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/dpdk/memif_args.h"
#include "bench/dpdk/raw_memif.h"
#include "bench/support/bench_util.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/transport/dpdk/factory.h"
#include "fabric/transport/registry.h"

namespace cofab::bench {
namespace {

using transport::Connection;
using transport::Context;

constexpr size_t kMessage = 1 << 20;
constexpr int kInFlight = 8;
constexpr int kPings = 20000;
constexpr uint8_t kLast = 1;

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status error;
  void finish(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (!s.ok() && error.ok()) error = s;
    done = true;
    cv.notify_all();
  }
  bool wait(int seconds) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return done; });
  }
};

double nowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The "crc" case: bulk messages carry the end-to-end payload CRC32C (wire kFlagPayloadCrc) on top
// of the frame CRC. Set before the case's processes fork.
bool gPayloadCrc = false;
// The "zc" case: the receiver is the memif client in zero-copy mode (memifEalArgs), so memif's
// copy of each frame happens in the sender's process, into the receiver's own mbufs.
bool gZeroCopyRx = false;

// Server side: receives 1 MiB messages until the last one, then echoes 64-byte pings until the
// last one. Prints goodput_gbps.
std::string serve(Connection& conn) {
  // Receives still posted when this returns are cancelled at the context's join, after this
  // frame is gone: their state lives on the heap for the rest of the (short-lived) process.
  struct State {
    std::vector<std::vector<uint8_t>> bufs{kInFlight, std::vector<uint8_t>(kMessage)};
    Waiter w;
    Waiter closed;  // the client closed the bulk connection (after it got the confirmation)
    std::atomic<uint64_t> bytes{0};
    std::atomic<bool> last{false};
    double first = 0, end = 0;
    std::function<void(int)> post;
  };
  auto& st = *new State;
  auto& bufs = st.bufs;
  auto& w = st.w;
  auto& bytes = st.bytes;
  auto& last = st.last;
  auto& first = st.first;
  auto& end = st.end;
  auto& post = st.post;
  post = [&](int i) {
    conn.recv(bufs[i].data(), kMessage, [&, i](const Status& s, const wire::Header& h) {
      if (!s.ok()) return last ? st.closed.finish(s) : w.finish(s);
      if (bytes.fetch_add(kMessage) == 0) first = nowS();
      if (h.opcode == kLast) {
        end = nowS();
        last = true;
        // Tell the client everything arrived: it must not close (and end its drain) before.
        wire::Header done;
        done.opcode = kLast;
        conn.send(done, nullptr, 0, [](const Status&) {});
        return w.finish(OkStatus());
      }
      if (!last) post(i);
    });
  };
  for (int i = 0; i < kInFlight; ++i) post(i);
  if (!w.wait(60) || !w.error.ok()) return "error=" + w.error.toString();
  // The other receives stay posted until the client, confirmed, closes the connection: closing
  // this side first could cut the confirmation's retransmission short at 10% loss.
  st.closed.wait(30);
  const double gbps = static_cast<double>(bytes.load() - kMessage) * 8 / (end - first) / 1e9;
  return "goodput_gbps=" + std::to_string(gbps);
}

// Echoes 64-byte pings (from the receive callback, on the transport's thread) until the last
// one, then waits for the client to close: returning earlier would close this side while the
// last echo may still need a retransmission (at 10% loss), and the client would see the close
// instead of its reply.
std::string echo(Connection& conn) {
  struct State {
    Waiter w;
    Waiter closed;
    std::vector<uint8_t> buf = std::vector<uint8_t>(64);
    std::function<void()> post;
  };
  auto& st = *new State;  // see serve()
  auto& w = st.w;
  auto& buf = st.buf;
  auto& post = st.post;
  post = [&] {
    conn.recv(buf.data(), buf.size(), [&](const Status& s, const wire::Header& h) {
      if (!s.ok()) return w.finish(s);
      wire::Header r = h;
      conn.send(r, buf.data(), buf.size(), [](const Status&) {});
      if (h.opcode == kLast) {
        conn.recv(buf.data(), buf.size(),
                  [&](const Status& s2, const wire::Header&) { st.closed.finish(s2); });
        return w.finish(OkStatus());
      }
      post();
    });
  };
  post();
  if (!w.wait(60) || !w.error.ok()) return "error=" + w.error.toString();
  st.closed.wait(10);  // the client's close (RemoteError), or give up after 10 s
  return "";
}

std::string blast(Connection& conn, double seconds) {
  struct State {
    std::vector<uint8_t> src = std::vector<uint8_t>(kMessage, 0x5A);
    Waiter w;
    std::atomic<int> inflight{0};
    std::atomic<bool> stop{false};
    std::function<void()> one;
  };
  auto& st = *new State;  // see serve()
  auto& src = st.src;
  auto& w = st.w;
  auto& inflight = st.inflight;
  auto& stop = st.stop;
  const double until = nowS() + seconds;
  auto& one = st.one;
  one = [&, until] {
    wire::Header h;
    if (gPayloadCrc) h.flags = wire::kFlagPayloadCrc;
    const bool lastOne = nowS() >= until;
    if (lastOne) {
      if (stop.exchange(true)) return;
      h.opcode = kLast;
    }
    ++inflight;
    conn.send(h, src.data(), src.size(), [&, lastOne](const Status& s) {
      --inflight;
      if (!s.ok()) return w.finish(s);
      if (lastOne) return w.finish(OkStatus());
      if (!stop) one();
    });
  };
  for (int i = 0; i < kInFlight; ++i) one();
  if (!w.wait(60) || !w.error.ok()) return "error=" + w.error.toString();
  // A send completes when its bytes are in frames, not when they arrived: wait for the server's
  // word that the last message did (at 10% loss the tail can take a while).
  auto& done = *new Waiter;  // see serve()
  conn.recv(nullptr, 0, [&done](const Status& s, const wire::Header&) { done.finish(s); });
  if (!done.wait(60)) return "error=the server did not confirm the last message";
  if (!done.error.ok()) return "error=" + done.error.toString();
  conn.close();  // lets the server go on (to the echo, or to its exit)
  return "";
}

// 64-byte round trips, each started from the previous one's receive callback (on the
// transport's thread), so the figure is the transport's round trip and not a thread hand-off.
std::string ping(Connection& conn) {
  struct State {
    std::vector<uint8_t> out = std::vector<uint8_t>(64, 1), in = std::vector<uint8_t>(64);
    std::vector<double> rtts;
    Waiter w;
    int i = 0;
    double t0 = 0;
    std::function<void()> next;
  };
  auto& st = *new State;  // a timed-out run may still complete later
  st.rtts.reserve(kPings);
  st.next = [&st, &conn] {
    wire::Header h;
    h.sequence = static_cast<uint64_t>(st.i);
    if (st.i == kPings) h.opcode = kLast;
    st.t0 = nowS();
    conn.recv(st.in.data(), st.in.size(), [&st](const Status& s, const wire::Header&) {
      if (!s.ok()) return st.w.finish(s);
      if (st.i >= 1000) st.rtts.push_back((nowS() - st.t0) * 1e6);  // first 1000: warm-up
      if (st.i++ == kPings) return st.w.finish(OkStatus());
      st.next();
    });
    conn.send(h, st.out.data(), st.out.size(), [](const Status&) {});
  };
  st.next();
  if (!st.w.wait(120)) return "error=pings timed out at " + std::to_string(st.i);
  if (!st.w.error.ok()) return "error=" + st.w.error.toString();
  conn.close();  // the server waits for this before it closes its side
  auto& rtts = st.rtts;
  std::sort(rtts.begin(), rtts.end());
  return "rtt_p50_us=" + std::to_string(rtts[rtts.size() / 2]) +
         " rtt_p99_us=" + std::to_string(rtts[rtts.size() * 99 / 100]);
}

// Poller CPU and frame counters of a dpdk context (zeros for other transports).
transport::dpdk::DpdkStats bulkCost(Context& ctx, const std::string& transport) {
  if (transport != "dpdk") return {};
  auto st = transport::dpdk::stats(ctx);
  return st.ok() ? *st : transport::dpdk::DpdkStats{};
}
// The bulk phase's cost: poller CPU ns per Data frame (built, on the sender; delivered in
// order, on the receiver) and the frame counts, so that loss efficiency (delivered / sent
// including retransmissions) and retransmissions per injected drop can be read off.
std::string bulkCostText(Context& ctx, const std::string& transport,
                         const transport::dpdk::DpdkStats& before, bool receiver) {
  if (transport != "dpdk") return "";
  const auto after = bulkCost(ctx, transport);
  const uint64_t cpu = after.pollerCpuNs - before.pollerCpuNs;
  const uint64_t busy = after.pollerBusyNs - before.pollerBusyNs;
  const uint64_t frames = receiver ? after.rxDataDelivered - before.rxDataDelivered
                                   : after.txDataFrames - before.txDataFrames;
  return " bulk_cpu_ns=" + std::to_string(cpu) + " bulk_frames=" + std::to_string(frames) +
         " bulk_retransmits=" + std::to_string(after.retransmits - before.retransmits) +
         " bulk_drops=" + std::to_string(after.rxInjectedDrops - before.rxInjectedDrops) +
         " bulk_placed=" + std::to_string(after.rxDataPlaced - before.rxDataPlaced) +
         " cpu_ns_per_frame=" +
         (frames > 0 ? std::to_string(static_cast<double>(cpu) / static_cast<double>(frames))
                     : std::string("nan")) +
         " busy_ns_per_frame=" +
         (frames > 0 ? std::to_string(static_cast<double>(busy) / static_cast<double>(frames))
                     : std::string("nan"));
}

// One side of a transport case. `transport` is "dpdk" or "tcp".
std::string side(const std::string& transport, bool server, const std::string& dir, double seconds,
                 double dropRate, int64_t spinUs) {
  // Which side is the memif server: the receiver, unless it is the zero-copy client. A memif
  // client's port only starts once its server listens, so the server's context comes first.
  const bool zc = gZeroCopyRx && transport == "dpdk";
  const bool memifServer = zc ? !server : server;
  if (transport == "dpdk") {
    ::setenv("COFAB_DPDK_EAL_ARGS", memifEalArgs(memifServer, zc).c_str(), 1);
    ::setenv("COFAB_DPDK_VDEV", memifVdev(dir + "/memif.sock", memifServer, zc).c_str(), 1);
  }
  auto store = FileStore::open(dir + "/store");
  if (!store.ok()) return "error=" + store.status().toString();
  auto makeContext = [&]() -> StatusOr<std::shared_ptr<Context>> {
    return transport == "dpdk"
               ? transport::dpdk::createContext({.localId = server ? "srv" : "cli"},
                                                {.dropRate = dropRate, .idleSpinUs = spinUs})
               : transport::Registry::create(transport, {});
  };
  StatusOr<std::shared_ptr<Context>> ctx = Unavailable("no context yet");
  if (zc) {
    if (memifServer) {
      ctx = makeContext();
      if (!ctx.ok()) return "error=" + ctx.status().toString();
      if (!(*store)->set("memif_up", Bytes{1}).ok()) return "error=store";
    } else {
      auto up = (*store)->get("memif_up", Deadline::afterMs(30000));
      if (!up.ok()) return "error=" + up.status().toString();
    }
  }
  if (!server) {
    auto up = (*store)->get("addr", Deadline::afterMs(30000));
    if (!up.ok()) return "error=" + up.status().toString();
  }
  if (!ctx.ok()) ctx = makeContext();
  if (!ctx.ok()) return "error=" + ctx.status().toString();
  std::string out;
  if (server) {
    auto l = (*ctx)->listen({});
    if (!l.ok()) return "error=" + l.status().toString();
    const std::string a = (*l)->address();
    if (!(*store)->set("addr", Bytes(a.begin(), a.end())).ok()) return "error=store";
    auto conn = (*l)->accept(Deadline::afterMs(30000));
    if (!conn.ok()) return "error=" + conn.status().toString();
    auto c2 = (*l)->accept(Deadline::afterMs(30000));
    if (!c2.ok()) return "error=" + c2.status().toString();
    // Syns can arrive in either order (one may be lost at 10% loss): tell them apart by id.
    if ((*conn)->peerId() != "bulk") std::swap(*conn, *c2);
    const auto before = bulkCost(**ctx, transport);
    out = serve(**conn);
    out += bulkCostText(**ctx, transport, before, true);
    // No round trips under loss: single-frame messages lost at the tail wait for the RTO.
    const std::string e = dropRate > 0 ? "" : echo(**c2);
    if (!e.empty()) out = e;
  } else {
    auto a = (*store)->get("addr", Deadline::afterMs(30000));
    const std::string addr(a->begin(), a->end());
    auto conn = (*ctx)->connect(addr, {.localId = "bulk"}, Deadline::afterMs(30000));
    if (!conn.ok()) return "error=" + conn.status().toString();
    auto c2 = (*ctx)->connect(addr, {.localId = "ping"}, Deadline::afterMs(30000));
    if (!c2.ok()) return "error=" + c2.status().toString();
    const auto before = bulkCost(**ctx, transport);
    out = blast(**conn, seconds);
    out += bulkCostText(**ctx, transport, before, false);
    if (out.find("error=") == std::string::npos && dropRate == 0) out += " " + ping(**c2);
  }
  if (transport == "dpdk") {
    // What the reliability layer did, for reading the lossy figures.
    auto st = transport::dpdk::stats(**ctx);
    if (st.ok()) {
      out += " retransmits=" + std::to_string(st->retransmits) +
             " timeouts=" + std::to_string(st->timeouts) +
             " injected_drops=" + std::to_string(st->rxInjectedDrops) +
             " tx_drops=" + std::to_string(st->txDrops) +
             " stall_inflight=" + std::to_string(st->txStallInFlight) +
             " stall_peer_window=" + std::to_string(st->txStallPeerWindow) +
             " stall_pool=" + std::to_string(st->txStallPool) +
             " stall_backlog=" + std::to_string(st->txStallBacklog) +
             " stall_pipe=" + std::to_string(st->txStallPipe) +
             " rx_frames=" + std::to_string(st->rxFrames);
    }
  }
  (*ctx)->join();
  return out;
}

// Runs fn in a forked child; its one-line answer comes back through a pipe.
struct Child {
  pid_t pid = -1;
  int fd = -1;
};
Child spawn(const std::function<std::string()>& fn) {
  int p[2];
  if (::pipe(p) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::alarm(120);  // a stuck case must not hang the run
    const std::string s = fn() + "\n";
    if (::write(p[1], s.data(), s.size()) < 0) _exit(2);
    _exit(0);
  }
  ::close(p[1]);
  return {pid, p[0]};
}
std::string collect(Child c) {
  std::string s;
  char buf[256];
  ssize_t n;
  while ((n = ::read(c.fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<size_t>(n));
  ::close(c.fd);
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}
std::string valueOf(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  if (at == std::string::npos) return "nan";
  const auto end = line.find(' ', at);
  return line.substr(at + key.size() + 1,
                     end == std::string::npos ? end : end - at - key.size() - 1);
}

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  // The dpdk pollers' idle policy (COFAB_DPDK_IDLE_SPIN_US) for the main cases: the library
  // default (spin 50 us, then nap) unless a second argument says otherwise (-1: busy-poll). A
  // last case always busy-polls, for comparison: on a quiet host with a core per side it is the
  // usual DPDK set-up; on an oversubscribed one a spinning poller loses its core to the others.
  const int64_t spinUs = argc > 2 ? std::atoll(argv[2]) : 50;
  const std::string dir = makeTempDir("cofab-dpdk-bench");
  if (dir.empty()) return 1;

  // Raw memif frame rate: the receiver (server) must be up before the client connects.
  // Which cases run (third argument, comma-separated; default all): raw, dpdk, lossy, tcp, busy,
  // crc (lossless with the end-to-end payload CRC on), zc (lossless with the receiver as a
  // zero-copy memif client, and raw memif set up the same way).
  const std::string cases = argc > 3 ? argv[3] : "raw,dpdk,lossy,tcp,busy,crc,zc";
  auto want = [&](const std::string& c) {
    return ("," + cases + ",").find("," + c + ",") != std::string::npos;
  };
  // The memif server starts first: the receiver, or with `zeroCopy` the sender (the receiver is
  // then the zero-copy client).
  auto runRaw = [&](bool zeroCopy) {
    const std::string sock = dir + (zeroCopy ? "/raw_zc.sock" : "/raw.sock");
    auto rawSide = [&](bool sender) {
      const bool memifServer = zeroCopy ? sender : !sender;
      return runRawMemif(
          memifEalArgs(memifServer, zeroCopy) + " --vdev=" + memifVdev(sock, memifServer, zeroCopy),
          sender, 1514, seconds);
    };
    auto rxFn = [&] {
      auto r = rawSide(false);
      return r.ok ? "raw_gbps=" + std::to_string(r.gbps) + " raw_mpps=" + std::to_string(r.mpps)
                  : "error=" + r.error;
    };
    auto txFn = [&] {
      auto r = rawSide(true);
      return r.ok ? std::string("ok") : "error=" + r.error;
    };
    Child first = spawn(zeroCopy ? std::function<std::string()>(txFn) : rxFn);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    Child second = spawn(zeroCopy ? std::function<std::string()>(rxFn) : txFn);
    const std::string a = collect(first), b = collect(second);
    const std::string& rx = zeroCopy ? b : a;
    const std::string& tx = zeroCopy ? a : b;
    std::printf("raw memif%s: %s (sender: %s)\n", zeroCopy ? " (zero-copy receiver)" : "",
                rx.c_str(), tx.c_str());
    return rx;
  };
  const std::string raw = want("raw") ? runRaw(false) : "skipped";

  auto runCase = [&](const std::string& transport, double drop, int64_t spin,
                     const std::string& name) -> std::pair<std::string, std::string> {
    if (!want(name)) return {"skipped", "skipped"};
    const std::string sub = dir + "/" + name + std::to_string(static_cast<int>(drop * 100)) + "_" +
                            std::to_string(spin);
    std::filesystem::create_directories(sub);
    gPayloadCrc = name == "crc";
    gZeroCopyRx = name == "zc";
    Child s = spawn([&] { return side(transport, true, sub, seconds, drop, spin); });
    Child c = spawn([&] { return side(transport, false, sub, seconds, drop, spin); });
    const std::string cs = collect(c);
    const std::string ss = collect(s);
    std::printf("%s (drop %.2f, idle spin %lld us): server: %s client: %s\n", transport.c_str(),
                drop, static_cast<long long>(spin), ss.c_str(), cs.c_str());
    return std::make_pair(ss, cs);
  };
  const auto dpdk = runCase("dpdk", 0, spinUs, "dpdk");
  const auto lossy = runCase("dpdk", 0.10, spinUs, "lossy");
  const auto tcp = runCase("tcp", 0, spinUs, "tcp");
  const auto busy = runCase("dpdk", 0, -1, "busy");
  const auto crc = runCase("dpdk", 0, spinUs, "crc");
  const std::string rawZc = want("zc") ? runRaw(true) : "skipped";
  const auto zc = runCase("dpdk", 0, spinUs, "zc");
  auto num = [](const std::string& v) { return v == "nan" ? 0.0 : std::atof(v.c_str()); };
  const std::string good = valueOf(dpdk.first, "goodput_gbps");
  const std::string lossyGood = valueOf(lossy.first, "goodput_gbps");
  const std::string tcpGood = valueOf(tcp.first, "goodput_gbps");
  const std::string rawGood = valueOf(raw, "raw_gbps");
  auto ratio = [&](const std::string& a, const std::string& b) {
    return num(b) > 0 && num(a) > 0 ? std::to_string(num(a) / num(b)) : std::string("nan");
  };
  std::printf(
      "RESULT dpdk_p2p frame=1500 goodput_gbps=%s raw_gbps=%s tcp_gbps=%s rtt_p50_us=%s "
      "tcp_rtt_p50_us=%s lossy10_goodput_gbps=%s idle_spin_us=%lld\n",
      good.c_str(), rawGood.c_str(), tcpGood.c_str(), valueOf(dpdk.second, "rtt_p50_us").c_str(),
      valueOf(tcp.second, "rtt_p50_us").c_str(), lossyGood.c_str(), static_cast<long long>(spinUs));
  std::printf(
      "RESULT dpdk_p2p_ratios of_raw=%s of_tcp=%s lossy10_of_lossless=%s "
      "busy_poll_goodput_gbps=%s busy_poll_rtt_p50_us=%s payload_crc_goodput_gbps=%s "
      "payload_crc_rx_cpu_ns_per_frame=%s\n",
      ratio(good, rawGood).c_str(), ratio(good, tcpGood).c_str(), ratio(lossyGood, good).c_str(),
      valueOf(busy.first, "goodput_gbps").c_str(), valueOf(busy.second, "rtt_p50_us").c_str(),
      valueOf(crc.first, "goodput_gbps").c_str(), valueOf(crc.first, "cpu_ns_per_frame").c_str());
  // Poller CPU per Data frame (sender: built; receiver: delivered), and under loss: frames
  // delivered per frame sent (retransmissions included) and sender retransmissions per drop
  // injected at the receiver.
  auto eff = [&](const std::pair<std::string, std::string>& c) {
    const double delivered = num(valueOf(c.first, "bulk_frames"));
    const double sent =
        num(valueOf(c.second, "bulk_frames")) + num(valueOf(c.second, "bulk_retransmits"));
    return sent > 0 ? std::to_string(delivered / sent) : std::string("nan");
  };
  auto perDrop = [&](const std::pair<std::string, std::string>& c) {
    const double drops = num(valueOf(c.first, "bulk_drops"));
    return drops > 0 ? std::to_string(num(valueOf(c.second, "bulk_retransmits")) / drops)
                     : std::string("nan");
  };
  std::printf(
      "RESULT dpdk_p2p_cost tx_cpu_ns_per_frame=%s rx_cpu_ns_per_frame=%s "
      "lossy10_tx_cpu_ns_per_frame=%s lossy10_rx_cpu_ns_per_frame=%s "
      "lossy10_delivered_per_sent=%s lossy10_retransmits_per_drop=%s "
      "busy_tx_cpu_ns_per_frame=%s busy_rx_cpu_ns_per_frame=%s tx_busy_ns_per_frame=%s "
      "rx_busy_ns_per_frame=%s lossy10_tx_busy_ns_per_frame=%s lossy10_rx_busy_ns_per_frame=%s\n",
      valueOf(dpdk.second, "cpu_ns_per_frame").c_str(),
      valueOf(dpdk.first, "cpu_ns_per_frame").c_str(),
      valueOf(lossy.second, "cpu_ns_per_frame").c_str(),
      valueOf(lossy.first, "cpu_ns_per_frame").c_str(), eff(lossy).c_str(), perDrop(lossy).c_str(),
      valueOf(busy.second, "cpu_ns_per_frame").c_str(),
      valueOf(busy.first, "cpu_ns_per_frame").c_str(),
      valueOf(dpdk.second, "busy_ns_per_frame").c_str(),
      valueOf(dpdk.first, "busy_ns_per_frame").c_str(),
      valueOf(lossy.second, "busy_ns_per_frame").c_str(),
      valueOf(lossy.first, "busy_ns_per_frame").c_str());
  // The zero-copy memif set-up, against raw memif in the same set-up (its own ceiling).
  const std::string zcGood = valueOf(zc.first, "goodput_gbps");
  const std::string zcRaw = valueOf(rawZc, "raw_gbps");
  std::printf(
      "RESULT dpdk_p2p_zero_copy goodput_gbps=%s raw_gbps=%s of_raw=%s tx_busy_ns_per_frame=%s "
      "rx_busy_ns_per_frame=%s\n",
      zcGood.c_str(), zcRaw.c_str(), ratio(zcGood, zcRaw).c_str(),
      valueOf(zc.second, "busy_ns_per_frame").c_str(),
      valueOf(zc.first, "busy_ns_per_frame").c_str());
  std::filesystem::remove_all(dir);  // stores and memif sockets
  return 0;
}
