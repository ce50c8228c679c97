// The dpdk transport between two processes over memif (DPDK's shared-memory packet interface),
// meeting through a FileStore: each forked child starts its own EAL (one per process), the
// server on lcore 1, the client on lcore 0. This binary never starts EAL in the parent, so the
// children fork from a clean process. Ordering, message sizes, close, and a killed peer; the
// same echo over af_packet on a veth pair in a network namespace the test creates.
// A child that cannot start EAL exits with kSkipCode after storing the reason; the test skips.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <thread>

#include "core/param.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/transport/dpdk/factory.h"
#include "fabric/transport/dpdk/frame.h"
#include "tests/fabric/transport/transport_test_util.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"
#include "tests/support/veth_netns.h"

namespace cofab::transport::testing {
namespace {

constexpr int kSkipCode = 77;
using cofab::testing::bringUp;
using cofab::testing::childFail;
using cofab::testing::makeVethPairNetns;
using cofab::testing::moveToNetnsOf;
using cofab::testing::ProcessGroup;
using cofab::testing::unshareNetns;

Bytes toBytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Runs in the echo server (rank 0) once it accepted the connection, before the echoes.
using AcceptedHook = std::function<Status(Context&, Connection&)>;

// Sets the EAL arguments and the memif vdev of one side, then creates the context. With
// `zeroCopy` the client (rank 1) is memif's zero-copy client: it lends its own mbufs and the
// server copies every frame into and out of them (DPDK wants --single-file-segments for it).
StatusOr<std::shared_ptr<Context>> memifContext(const std::string& dir, int rank,
                                                const std::string& id, Store& store,
                                                bool zeroCopy = false) {
  const bool server = rank == 0;
  const bool zc = zeroCopy && !server;
  const std::string sock = dir + "/memif.sock";
  ::setenv("COFAB_DPDK_EAL_ARGS",
           ((server ? "-l 1" : "-l 0") +
            std::string(" --no-huge -m 256 --no-pci --no-shconf "
                        "--no-telemetry") +
            (zc ? " --single-file-segments" : ""))
               .c_str(),
           1);
  ::setenv("COFAB_DPDK_VDEV",
           ("net_memif0,role=" + std::string(server ? "server" : "client") + ",socket=" + sock +
            ",socket-abstract=no" + (zc ? ",zero-copy=yes" : ""))
               .c_str(),
           1);
  // The memif client connects to the server's socket when its port starts and does not retry
  // soon after a refusal, so the server's EAL comes up first.
  if (!server) {
    auto up = store.get("server-up", Deadline::afterMs(20000));
    if (!up.ok()) return up.status();
    if (toString(*up) != "ok") return Unavailable(toString(*up));
  }
  auto ctx = dpdk::createContext({.localId = id}, {.peerTimeoutMs = 1000});
  if (!ctx.ok() && ctx.status().code() == StatusCode::kUnavailable) {
    store.set("skip", toBytes(ctx.status().toString())).ignoreError();
  }
  if (server) {
    store.set("server-up", toBytes(ctx.ok() ? "ok" : ctx.status().toString())).ignoreError();
  }
  return ctx;
}

class DpdkMemifTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FileStore::open(dir_.path() + "/store");
    ASSERT_TRUE(s.ok()) << s.status();
  }
  std::unique_ptr<Store> store() {
    return std::move(FileStore::open(dir_.path() + "/store")).value();
  }

  // Reaps both children; skips when one could not start EAL.
  void finish(ProcessGroup& group, int n) {
    auto exits = group.waitAll(Deadline::afterMs(40000));
    for (const auto& e : exits) {
      if (e.exited && e.code == kSkipCode) {
        auto reason = store()->get("skip", Deadline::afterMs(100));
        GTEST_SKIP() << "EAL cannot start: " << (reason.ok() ? toString(*reason) : "unknown");
      }
    }
    (void)n;
    EXPECT_EQ(cofab::testing::failures(exits), "");
  }

  // echoSizes (below) between a memif server (rank 0) and client (rank 1) process.
  void echoOverMemif(bool zeroCopyClient, const AcceptedHook& onAccepted = nullptr);

  cofab::testing::TempDir dir_;
};

// Rank 0 listens and echoes every message back; rank 1 sends messages of every interesting size
// (0 bytes to 8 MiB), checks each echo, then closes: the server's next receive fails with
// RemoteError. Run by each child over whatever link its context has (memif, af_packet).
int echoSizes(int rank, Context& ctx, Store& storeRef, const AcceptedHook& onAccepted = nullptr) {
  Store* st = &storeRef;
  const std::vector<size_t> sizes = {0, 1, 7, 1441, 4093, 65537, (1u << 20) + 3, 8u << 20};
  std::shared_ptr<Connection> conn;
  std::unique_ptr<Listener> listener;
  if (rank == 0) {
    auto l = ctx.listen({});
    if (!l.ok()) return childFail(rank, l.status().toString());
    listener = std::move(l).value();
    if (!st->set("addr", toBytes(listener->address())).ok()) return childFail(rank, "store");
    auto a = listener->accept(Deadline::afterMs(20000));
    if (!a.ok()) return childFail(rank, a.status().toString());
    conn = *a;
    if (conn->peerId() != "client") return childFail(rank, "peer id " + conn->peerId());
    if (onAccepted) {
      if (Status hs = onAccepted(ctx, *conn); !hs.ok()) return childFail(rank, hs.toString());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      Recorder rec;
      std::vector<uint8_t> got;
      conn->recvOwned([&](const Status& s, const wire::Header& h, std::vector<uint8_t>&& d) {
        got = std::move(d);
        rec.record(s, h);
      });
      if (!rec.wait(1, std::chrono::seconds(20))) return childFail(rank, "recv timed out");
      if (!rec.statuses()[0].ok()) return childFail(rank, rec.statuses()[0].toString());
      if (rec.headers()[0].sequence != i) return childFail(rank, "out of order");
      Recorder sent;
      conn->send(rec.headers()[0], got.data(), got.size(), sent.sendCb());
      if (!sent.wait(1, std::chrono::seconds(20)) || !sent.statuses()[0].ok()) {
        return childFail(rank, "echo send failed");
      }
    }
    // The client closes after its last echo: the next receive fails with RemoteError.
    Recorder last;
    conn->recvOwned(
        [&](const Status& s, const wire::Header& h, std::vector<uint8_t>&&) { last.record(s, h); });
    if (!last.wait(1, std::chrono::seconds(20))) return childFail(rank, "no close seen");
    if (last.statuses()[0].code() != StatusCode::kRemoteError) {
      return childFail(rank, "after close: " + last.statuses()[0].toString());
    }
    ctx.join();
    return 0;
  }
  auto addr = st->get("addr", Deadline::afterMs(20000));
  if (!addr.ok()) return childFail(rank, addr.status().toString());
  auto c = ctx.connect(toString(*addr), {.localId = "client"}, Deadline::afterMs(20000));
  if (!c.ok()) return childFail(rank, c.status().toString());
  conn = *c;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto src = pattern(sizes[i], static_cast<uint32_t>(i));
    std::vector<uint8_t> back(src.size());
    Recorder rec;
    wire::Header h;
    h.sequence = i;
    h.flags = wire::kFlagPayloadCrc;
    conn->recv(back.data(), back.size(), rec.recvCb());
    conn->send(h, src.data(), src.size(), rec.sendCb());
    if (!rec.wait(2, std::chrono::seconds(20))) return childFail(rank, "echo timed out");
    for (const auto& s : rec.statuses()) {
      if (!s.ok()) return childFail(rank, s.toString());
    }
    if (back != src) return childFail(rank, "echo of " + std::to_string(sizes[i]) + " differs");
  }
  conn->close();
  ctx.join();  // drains the Fin before the process goes
  return 0;
}

void DpdkMemifTest::echoOverMemif(bool zeroCopyClient, const AcceptedHook& onAccepted) {
  const std::string dir = dir_.path();
  ProcessGroup group;
  group.start(2, [this, dir, zeroCopyClient, onAccepted](int rank) -> int {
    auto st = store();
    auto ctx = memifContext(dir, rank, rank == 0 ? "server" : "client", *st, zeroCopyClient);
    if (!ctx.ok())
      return ctx.status().code() == StatusCode::kUnavailable
                 ? kSkipCode
                 : childFail(rank, ctx.status().toString());
    return echoSizes(rank, **ctx, *st, onAccepted);
  });
  finish(group, 2);
}

// The client sends messages of every interesting size; the server echoes each one back.
TEST_F(DpdkMemifTest, EchoSizesInOrderThenClose) { echoOverMemif(false); }

// The same echo with the client in memif's zero-copy mode: its frames arrive in, and leave
// from, mbufs of its own pool that the server process writes and reads. The transport must not
// care where an mbuf's bytes were put.
TEST_F(DpdkMemifTest, EchoSizesWithAZeroCopyMemifClient) { echoOverMemif(true); }

// The frame CRC covers the cofab header and payload, not the Ethernet header. Before the echoes,
// the server gets an ack of the live connection whose source MAC had a bit flipped on the way:
// it is dropped and counted, not answered with a reset, which memif (point to point, no MAC
// filter) would carry to the client and which names the client's connection: it tore it down.
TEST_F(DpdkMemifTest, AFrameWithAFlippedSourceMacDoesNotResetTheConnection) {
  echoOverMemif(false, [](Context& ctx, Connection& conn) -> Status {
    auto ids = dpdk::connectionIds(conn);
    if (!ids.ok()) return ids.status();
    auto from = dpdk::parseNetAddress(conn.peerAddress());
    auto here = dpdk::localAddress(ctx);
    if (!from.ok()) return from.status();
    if (!here.ok()) return here.status();
    auto to = dpdk::parseNetAddress(*here);
    if (!to.ok()) return to.status();
    from->mac[5] ^= 0x10;
    dpdk::FrameHeader h;
    h.kind = dpdk::FrameKind::kAck;
    h.dstConn = ids->local;
    h.srcConn = ids->peer;
    std::vector<uint8_t> frame(dpdk::frameSize(h));
    dpdk::writeFrameHeaders(frame.data(), *from, *to, h);
    dpdk::sealFrame(frame.data());
    auto before = dpdk::stats(ctx);
    if (!before.ok()) return before.status();
    COFAB_RETURN_IF_ERROR(dpdk::injectFrame(ctx, frame));
    const Deadline d = Deadline::afterMs(5000);
    auto now = dpdk::stats(ctx);
    while (now.ok() && now->rxUnknownConnection == before->rxUnknownConnection && !d.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      now = dpdk::stats(ctx);
    }
    if (!now.ok()) return now.status();
    if (now->rxUnknownConnection != before->rxUnknownConnection + 1) {
      return Internal("the flipped frame was not counted as for an unknown connection");
    }
    return OkStatus();
  });
}

// A zero-copy memif client without --single-file-segments: DPDK refuses the vdev, and the
// context says so with the missing argument named, instead of a bare "did not probe".
TEST_F(DpdkMemifTest, ZeroCopyClientWithoutSingleFileSegmentsNamesTheMissingArgument) {
  const std::string dir = dir_.path();
  ProcessGroup group;
  group.start(1, [this, dir](int) -> int {
    auto st = store();
    ::setenv("COFAB_DPDK_EAL_ARGS", "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry", 1);
    ::setenv("COFAB_DPDK_VDEV",
             ("net_memif0,role=client,socket=" + dir + "/memif.sock,socket-abstract=no," +
              "zero-copy=yes")
                 .c_str(),
             1);
    auto ctx = dpdk::createContext({.localId = "client"}, {});
    if (ctx.ok()) return childFail(1, "the context started");
    if (ctx.status().code() == StatusCode::kUnavailable) {
      st->set("skip", toBytes(ctx.status().toString())).ignoreError();
      return kSkipCode;
    }
    if (ctx.status().code() != StatusCode::kFailedPrecondition ||
        ctx.status().message().find("--single-file-segments") == std::string::npos) {
      return childFail(1, "expected FailedPrecondition naming --single-file-segments, got " +
                              ctx.status().toString());
    }
    return 0;
  });
  finish(group, 1);
}

// The same echo over a real kernel wire: af_packet on each end of a veth pair, each end in its
// own network namespace the test creates (an intermediate child unshares the first and makes the
// pair; the client unshares the second and is handed its end), so nothing outlives the test: the
// namespaces and the pair go when their processes exit. One namespace per end because DPDK's
// af_packet port joins a PACKET_FANOUT group numbered (pid ^ ifindex) & 0xffff, and fanout
// groups are per namespace: two ports in one namespace collide whenever pid0 ^ if0 == pid1 ^ if1
// (consecutive pids and ifindexes: about every other run), the second probe then fails and that
// process had no port at all (tests/support/veth_netns.h). IPv6 is off, so the ports see only the
// test's frames. Skipped
// with the reason when the namespaces or the veth pair cannot be made (not root, no iproute2).
TEST_F(DpdkMemifTest, EchoSizesOverAfPacketVethInOwnNetns) {
  ProcessGroup ns;
  ns.start(1, [this](int) -> int {
    auto st = store();
    auto skip = [&](const std::string& why) {
      st->set("skip", toBytes(why)).ignoreError();
      return kSkipCode;
    };
    if (std::string why = makeVethPairNetns("cfdk0", "cfdk1"); !why.empty()) return skip(why);
    ProcessGroup pair;
    pair.start(2, [this](int rank) -> int {
      auto st2 = store();
      const std::string iface = "cfdk" + std::to_string(rank);
      // The client takes a namespace of its own; the parent moves cfdk1 into it.
      if (rank == 1) {
        if (std::string why = unshareNetns(); !why.empty()) return childFail(rank, why);
      }
      if (Status s = bringUp(iface, 10000); !s.ok()) return childFail(rank, s.toString());
      ::setenv("COFAB_DPDK_EAL_ARGS",
               rank == 0 ? "-l 1 --no-huge -m 256 --no-pci --no-shconf --no-telemetry"
                         : "-l 0 --no-huge -m 256 --no-pci --no-shconf --no-telemetry",
               1);
      ::setenv("COFAB_DPDK_VDEV", ("net_af_packet0,iface=" + iface + ",framecnt=4096").c_str(), 1);
      auto ctx = dpdk::createContext({.localId = rank == 0 ? "server" : "client"},
                                     {.peerTimeoutMs = 3000});
      if (!ctx.ok()) {
        if (ctx.status().code() != StatusCode::kUnavailable) {
          return childFail(rank, ctx.status().toString());
        }
        st2->set("skip", toBytes(ctx.status().toString())).ignoreError();
        return kSkipCode;
      }
      return echoSizes(rank, **ctx, *st2);
    });
    if (Status moved = moveToNetnsOf("cfdk1", pair.pid(1), 10000); !moved.ok()) {
      pair.waitAll(Deadline::afterMs(0));
      return childFail(0, moved.toString());
    }
    auto exits = pair.waitAll(Deadline::afterMs(35000));
    for (const auto& e : exits) {
      if (e.exited && e.code == kSkipCode) return kSkipCode;
    }
    const std::string f = cofab::testing::failures(exits);
    return f.empty() ? 0 : childFail(0, f);
  });
  finish(ns, 1);
}

// The client process is killed (SIGKILL, no goodbye) while the server waits in a receive: the
// server's receive fails with RemoteError naming the peer, within its peer timeout (1 s here).
TEST_F(DpdkMemifTest, KilledPeerGivesRemoteErrorWithinDeadline) {
  const std::string dir = dir_.path();
  ProcessGroup group;
  group.start(2, [this, dir](int rank) -> int {
    auto st = store();
    auto ctx = memifContext(dir, rank, rank == 0 ? "server" : "doomed child", *st);
    if (!ctx.ok())
      return ctx.status().code() == StatusCode::kUnavailable
                 ? kSkipCode
                 : childFail(rank, ctx.status().toString());
    if (rank == 1) {
      auto addr = st->get("addr", Deadline::afterMs(20000));
      if (!addr.ok()) return childFail(rank, addr.status().toString());
      auto c =
          (*ctx)->connect(toString(*addr), {.localId = "doomed child"}, Deadline::afterMs(20000));
      if (!c.ok()) return childFail(rank, c.status().toString());
      st->set("connected", toBytes("1")).ignoreError();
      ::pause();  // killed by the server's signal
      return 0;
    }
    auto l = (*ctx)->listen({});
    if (!l.ok()) return childFail(rank, l.status().toString());
    if (!st->set("addr", toBytes((*l)->address())).ok()) return childFail(rank, "store");
    auto a = (*l)->accept(Deadline::afterMs(20000));
    if (!a.ok()) return childFail(rank, a.status().toString());
    std::vector<uint8_t> buf(1000);
    Recorder rec;
    (*a)->recv(buf.data(), buf.size(), rec.recvCb());
    if (!st->get("connected", Deadline::afterMs(20000)).ok()) return childFail(rank, "no peer");
    auto pid = st->get("victim", Deadline::afterMs(20000));
    if (!pid.ok()) return childFail(rank, "no victim pid");
    ::kill(static_cast<pid_t>(std::stol(toString(*pid))), SIGKILL);
    if (!rec.wait(1, std::chrono::seconds(10))) return childFail(rank, "receive did not fail");
    const Status s = rec.statuses()[0];
    if (s.code() != StatusCode::kRemoteError ||
        s.message().find("doomed child") == std::string::npos) {
      return childFail(rank, "expected RemoteError naming the peer, got " + s.toString());
    }
    // What was queued for the dead peer (memif refuses every burst while its link is down) is
    // dropped and counted once the port has taken nothing for a while. It stayed queued, and
    // counted as work, kept the poller spinning on a core for as long as the context lived.
    const Deadline d = Deadline::afterMs(10000);
    auto st2 = dpdk::stats(**ctx);
    while (st2.ok() && st2->txDrops == 0 && !d.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      st2 = dpdk::stats(**ctx);
    }
    if (!st2.ok() || st2->txDrops == 0) {
      return childFail(rank, "frames queued for the dead peer were never dropped");
    }
    (*ctx)->join();
    return 0;
  });
  ASSERT_TRUE(store()->set("victim", toBytes(std::to_string(group.pid(1)))).ok());
  auto exits = group.waitAll(Deadline::afterMs(40000));
  for (const auto& e : exits) {
    if (e.exited && e.code == kSkipCode) {
      auto reason = store()->get("skip", Deadline::afterMs(100));
      GTEST_SKIP() << "EAL cannot start: " << (reason.ok() ? toString(*reason) : "unknown");
    }
  }
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_TRUE(exits[0].exited && exits[0].code == 0) << exits[0].describe();
  EXPECT_FALSE(exits[1].exited) << "the victim should have been killed: " << exits[1].describe();
}

}  // namespace
}  // namespace cofab::transport::testing
