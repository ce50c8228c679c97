// tcp-only behaviour: interface selection, addresses, several loops, a peer that is not cofab.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/param.h"
#include "fabric/transport/tcp/factory.h"
#include "fabric/transport/tcp/socket_util.h"
#include "tests/support/descriptor_hog.h"
#include "tests/fabric/transport/transport_test_util.h"

namespace cofab::transport::testing {
namespace {

// A tcp context "s" listening, a context "c" connected to it, and the connection's two ends.
struct TcpPair {
  std::shared_ptr<Context> server, client;
  std::unique_ptr<Listener> listener;
  ConnPair conn;
};

// Fills `p`; call through ASSERT_NO_FATAL_FAILURE, since a failed step ends only this function.
void connectTcpPair(TcpPair* p, const ContextOptions& serverOptions = {.localId = "s"},
                    const tcp::TcpOptions& serverTcp = {},
                    const ContextOptions& clientOptions = {.localId = "c"},
                    const tcp::TcpOptions& clientTcp = {}, const ConnectOptions& connect = {}) {
  auto s = tcp::createContext(serverOptions, serverTcp);
  ASSERT_TRUE(s.ok()) << s.status();
  auto c = tcp::createContext(clientOptions, clientTcp);
  ASSERT_TRUE(c.ok()) << c.status();
  p->server = *s;
  p->client = *c;
  auto l = p->server->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  p->listener = std::move(*l);
  auto cc = p->client->connect(p->listener->address(), connect, testDeadline());
  ASSERT_TRUE(cc.ok()) << cc.status();
  auto a = p->listener->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  p->conn = {*cc, *a};
}

// True once the listener has closed `fd` (EOF or reset), false if it is still open when the
// deadline passes.
bool closedByPeer(int fd, Deadline deadline) {
  while (!deadline.expired()) {
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, std::max(deadline.remainingMsForPoll(), 0));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    uint8_t b[256];
    const ssize_t r = ::read(fd, b, sizeof(b));
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    // Anything else (a HelloAck) is not the close; keep waiting.
  }
  return false;
}

// A raw socket to `l`, connected; -1 on failure.
int rawConnect(Listener& l) {
  auto addr = tcp::parseAddress(l.address());
  if (!addr.ok()) return -1;
  const int fd = ::socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, addr->get(), addr->len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A server context with one connection accepted from a raw socket that sent the Hello: the
// test plays the peer byte by byte on `fd`.
struct RawPeerPair {
  std::shared_ptr<Context> context;
  std::unique_ptr<Listener> listener;
  int fd = -1;
  std::shared_ptr<Connection> conn;
};

// Fills `p`; call through ASSERT_NO_FATAL_FAILURE.
void acceptRawPeer(RawPeerPair* p) {
  auto s = tcp::createContext({.localId = "s"});
  ASSERT_TRUE(s.ok());
  p->context = *s;
  auto l = p->context->listen({});
  ASSERT_TRUE(l.ok());
  p->listener = std::move(*l);
  p->fd = rawConnect(*p->listener);
  ASSERT_GE(p->fd, 0);
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  const auto b = wire::encodeHeader(hello);
  ASSERT_EQ(::write(p->fd, b.data(), b.size()), 64);
  auto a = p->listener->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  p->conn = std::move(*a);
}

TEST(TcpTest, UnknownInterfaceFailsLoudlyListingTheAvailableOnes) {
  ScopedParamOverride o("COFAB_SOCKET_IFNAME", "nosuchif0");
  auto c = tcp::createContext({});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("nosuchif0"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("lo 127.0.0.1"), std::string::npos) << c.status();
}

TEST(TcpTest, InterfaceLoIsUsedForListening) {
  ScopedParamOverride o("COFAB_SOCKET_IFNAME", "lo");
  auto c = tcp::createContext({});
  ASSERT_TRUE(c.ok()) << c.status();
  auto l = (*c)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ((*l)->address().rfind("127.0.0.1:", 0), 0u) << (*l)->address();
}

TEST(TcpTest, ListenOnAnAddressThisHostDoesNotHave) {
  auto c = tcp::createContext({});
  ASSERT_TRUE(c.ok());
  auto l = (*c)->listen({.address = "192.0.2.1:0"});  // TEST-NET-1
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status();
  EXPECT_NE(l.status().message().find("available"), std::string::npos) << l.status();
}

TEST(TcpTest, AddressParsing) {
  EXPECT_TRUE(tcp::parseAddress("127.0.0.1:80").ok());
  EXPECT_TRUE(tcp::parseAddress("[::1]:80").ok());
  EXPECT_TRUE(tcp::parseAddress("localhost").ok());
  EXPECT_EQ(tcp::parseAddress("127.0.0.1:99999").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("127.0.0.1:x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("::1:80").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("[::1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("127.0.0.1:+80").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::parseAddress("127.0.0.1: 80").status().code(), StatusCode::kInvalidArgument);
  auto a = tcp::parseAddress("127.0.0.1:5000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->toString(), "127.0.0.1:5000");
}

// Slices whose sizes add up past 2^64 (or past what one readv/sendmsg reports) are the caller's
// error, for that operation only. The sum wrapped to a small payload length that passed the
// checks, and the syscall's EINVAL/EFAULT then failed the whole connection.
TEST(TcpTest, SlicesThatAddUpPastTheLimitAreRefusedAndTheConnectionLives) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p));
  uint8_t buf[8] = {};
  const size_t half = size_t{1} << 63;
  const ConstSlice wrapping[] = {{buf, half}, {buf, half}, {buf, 8}};  // "8 bytes"
  Recorder sent;
  p.conn.client->send(wire::Header{}, ConstSlices(wrapping), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  EXPECT_EQ(sent.statuses()[0].code(), StatusCode::kInvalidArgument) << sent.statuses()[0];
  const MutableSlice huge[] = {{buf, half}, {buf, half}, {buf, 8}};
  Recorder got;
  p.conn.server->recv(MutableSlices(huge), got.recvCb());
  ASSERT_TRUE(got.wait(1));
  EXPECT_EQ(got.statuses()[0].code(), StatusCode::kInvalidArgument) << got.statuses()[0];
  EXPECT_TRUE(p.conn.client->status().ok()) << p.conn.client->status();
  EXPECT_TRUE(p.conn.server->status().ok()) << p.conn.server->status();
  const std::vector<uint8_t> message(100, 3);
  std::vector<uint8_t> back(100);
  Recorder after;
  p.conn.server->recv(back.data(), back.size(), after.recvCb());
  p.conn.client->send(wire::Header{}, message.data(), message.size(), after.sendCb());
  ASSERT_TRUE(after.wait(2));
  EXPECT_TRUE(after.statuses()[0].ok() && after.statuses()[1].ok());
  EXPECT_EQ(back, message);
}

// A connect without a port (or to port 0) is a caller's mistake, said at once. Port 0 is
// refused like a listener not up yet, and the connect retried until its deadline; a name not
// in DNS was retried so before the port was looked at.
TEST(TcpTest, AConnectWithoutAPortIsRefusedAtOnce) {
  auto ctx = tcp::createContext({});
  ASSERT_TRUE(ctx.ok());
  for (const char* address :
       {"127.0.0.1", "127.0.0.1:0", "[::1]:0", "cofab-no-such-host.invalid"}) {
    auto c = (*ctx)->connect(address, {}, Deadline::afterMs(20000));
    ASSERT_FALSE(c.ok()) << address;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << address << ": " << c.status();
  }
}

// The listening side's id travels in every HelloAck: one past the handshake bound made every
// peer's connect fail while the misconfigured context itself reported nothing.
TEST(TcpTest, AnOverlongLocalIdIsRefusedAtCreation) {
  auto ctx = tcp::createContext({.localId = std::string(5000, 'x')}, {});
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), StatusCode::kInvalidArgument) << ctx.status();
  EXPECT_NE(ctx.status().message().find("localId"), std::string::npos) << ctx.status();
}

TEST(TcpTest, BadLoopCountParameterIsRejected) {
  ScopedParamOverride o("COFAB_TCP_LOOPS", "0");
  EXPECT_EQ(tcp::createContext({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TcpTest, SeveralLoopsAndExplicitSocketBuffers) {
  auto s = tcp::createContext({.localId = "s"}, {.loops = 3, .socketBufferBytes = 4 << 20});
  auto c = tcp::createContext({.localId = "c"}, {.loops = 2});
  ASSERT_TRUE(s.ok() && c.ok());
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok());
  std::vector<ConnPair> pairs;
  for (int i = 0; i < 6; ++i) {
    auto cc = (*c)->connect((*l)->address(), {}, testDeadline());
    ASSERT_TRUE(cc.ok()) << cc.status();
    auto a = (*l)->accept(testDeadline());
    ASSERT_TRUE(a.ok());
    pairs.push_back({*cc, *a});
  }
  const auto src = pattern(3 << 20, 1);
  std::vector<std::vector<uint8_t>> dst(6, std::vector<uint8_t>(src.size()));
  Recorder rec;
  for (int i = 0; i < 6; ++i) {
    pairs[i].server->recv(dst[i].data(), src.size(), rec.recvCb());
    pairs[i].client->send(wire::Header{}, src.data(), src.size(), rec.sendCb());
  }
  ASSERT_TRUE(rec.wait(12));
  for (const auto& st : rec.statuses()) EXPECT_TRUE(st.ok()) << st;
  for (const auto& d : dst) EXPECT_TRUE(d == src);
}

// A refused receive's callback gets its error even when it posts another receive first: the
// op goes back to the free list before the callback runs, and the new receive takes it again,
// so the status handed to the callback must not refer into the op.
TEST(TcpTest, ARefusedReceiveKeepsItsErrorWhenItsCallbackPostsAnother) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p));
  Connection* server = p.conn.server.get();
  std::vector<uint8_t> buf(8);
  Recorder seen, second;
  server->recv(nullptr, 8, [&](const Status& st, const wire::Header& h) {
    server->recv(buf.data(), buf.size(), second.recvCb());
    seen.record(st, h);
  });
  ASSERT_TRUE(seen.wait(1));
  EXPECT_EQ(seen.statuses()[0].code(), StatusCode::kInvalidArgument) << seen.statuses()[0];
  // The second receive is cancelled by the close, while `second` is still alive.
  p.server->close();
  p.server->join();
  ASSERT_TRUE(second.wait(1));
  p.client->close();
  p.client->join();
}

TEST(TcpTest, GarbageFromAPeerIsDataLossNotACrash) {
  auto s = tcp::createContext({.localId = "s"});
  ASSERT_TRUE(s.ok());
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok());
  // A raw client: valid handshake, then garbage where a header should be.
  auto addr = tcp::parseAddress((*l)->address());
  ASSERT_TRUE(addr.ok());
  const int fd = ::socket(addr->family(), SOCK_STREAM, 0);
  ASSERT_EQ(::connect(fd, addr->get(), addr->len), 0);
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  auto b = wire::encodeHeader(hello);
  ASSERT_EQ(::write(fd, b.data(), b.size()), 64);
  auto a = (*l)->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<uint8_t> junk(64, 0x5A);
  ASSERT_EQ(::write(fd, junk.data(), junk.size()), 64);
  std::vector<uint8_t> buf(10);
  Recorder rec;
  (*a)->recv(buf.data(), buf.size(), rec.recvCb());
  ASSERT_TRUE(rec.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kDataLoss) << rec.statuses()[0];
  ::close(fd);
}

TEST(TcpTest, OverlongAnnouncedPayloadIsRejectedBeforeReading) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p, {.localId = "s", .maxPayload = 1000}));
  std::vector<uint8_t> src(2000);
  Recorder rec;
  p.conn.server->recvOwned(
      [&](const Status& st, const wire::Header& h, std::vector<uint8_t>&&) { rec.record(st, h); });
  Recorder sent;  // src is lent until this completes
  p.conn.client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(rec.wait(1));
  ASSERT_TRUE(sent.wait(1));
  EXPECT_EQ(rec.statuses()[0].code(), StatusCode::kInvalidArgument) << rec.statuses()[0];
  EXPECT_NE(rec.statuses()[0].message().find("exceeds"), std::string::npos);
}

// Send callbacks run in posting order when the caller's thread wrote an earlier send itself
// and the loop fails a later one. Made deterministic by holding the client's loop inside a
// receive callback (run from its socket event) while the caller writes A inline, the peer resets
// the connection, and B's inline write fails and is queued for the loop: when the loop resumes,
// its write of B fails the connection, and B's error used to be reported before A's success.
TEST(TcpTest, SendCallbacksKeepPostingOrderWhenALaterSendFails) {
  signal(SIGPIPE, SIG_DFL);
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p));
  const auto& cc = p.conn.client;
  const auto& a = p.conn.server;

  std::promise<void> entered, release;
  auto releaseFuture = release.get_future().share();
  Recorder held;
  cc->recv(nullptr, 0, [&](const Status& st, const wire::Header& h) {
    entered.set_value();
    releaseFuture.wait();
    held.record(st, h);
  });
  // Over the inline-write limit, so the loop writes it after queueing the receive above: once
  // its callback ran, the receive is waiting on the socket, and the reply completes it from the
  // loop's event handling rather than from the posting.
  const auto big = pattern(300 << 10, 1);
  Recorder first;
  cc->send(wire::Header{}, big.data(), big.size(), first.sendCb());
  ASSERT_TRUE(first.wait(1));
  Recorder reply;
  a->send(wire::Header{}, nullptr, 0, reply.sendCb());
  entered.get_future().wait();

  constexpr size_t kLater = 16;
  Recorder sends;
  const auto small = pattern(64, 2);
  cc->send(wire::Header{}, small.data(), small.size(), sends.sendCb(0));  // A: inline
  // The server closes with unread bytes: its kernel answers with a reset.
  p.server->close();
  p.server->join();
  for (size_t i = 1; i <= kLater; ++i) {
    cc->send(wire::Header{}, small.data(), small.size(), sends.sendCb(i));
  }
  release.set_value();
  ASSERT_TRUE(held.wait(1));
  ASSERT_TRUE(sends.wait(kLater + 1));
  std::vector<size_t> inOrder(kLater + 1);
  std::iota(inOrder.begin(), inOrder.end(), size_t{0});
  EXPECT_EQ(sends.order(), inOrder);
  const auto st = sends.statuses();
  EXPECT_TRUE(st[0].ok()) << st[0];
  EXPECT_EQ(st[kLater].code(), StatusCode::kRemoteError) << st[kLater];
  for (size_t i = 2; i < st.size(); ++i) {
    // Once one failed, so does every later one.
    if (!st[i - 1].ok()) {
      EXPECT_FALSE(st[i].ok()) << "send " << i;
    }
  }
}

// Writing to a peer that has gone must be EPIPE -> RemoteError, not SIGPIPE killing the process.
TEST(TcpTest, SendToAClosedPeerIsRemoteErrorNotSigpipe) {
  signal(SIGPIPE, SIG_DFL);
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p));
  p.conn.server->close();
  p.server->join();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<uint8_t> buf(1 << 16);
  Status last;
  for (int i = 0; i < 200 && last.ok(); ++i) {
    Recorder rec;
    for (int k = 0; k < 4; ++k)
      p.conn.client->send(wire::Header{}, buf.data(), buf.size(), rec.sendCb());
    ASSERT_TRUE(rec.wait(4));
    for (const auto& st : rec.statuses()) {
      if (!st.ok()) last = st;
    }
  }
  EXPECT_EQ(last.code(), StatusCode::kRemoteError) << last;
  EXPECT_NE(last.message().find("'s'"), std::string::npos) << last;
}

// CPU seconds used so far by this process's tcp I/O threads (named "cofab-tcp<i>" by the loop),
// from /proc/self/task/*/stat. Only theirs: other threads of a test process (OpenBLAS's pool,
// linked through cofab::coding, spins for ~0.1 s after it starts) are not what this measures.
double ioThreadCpuSeconds() {
  double total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("cofab-tcp", 0) != 0) continue;
    std::ifstream statFile(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(statFile)), std::istreambuf_iterator<char>());
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int f = 3; f <= 15 && rest >> field; ++f) {
      if (f == 14) utime = std::stoull(field);
      if (f == 15) stime = std::stoull(field);
    }
    total += static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return total;
}

// Regression: a closed listener's socket used to stay readable in epoll and spin the loop.
// A connect still retrying (nobody listens yet) when its context is closed ends Cancelled,
// saying so: it used to come back as DeadlineExceeded "no listener answered by the deadline".
// A name that resolves to several addresses is tried at each of them: localhost is ::1 before
// 127.0.0.1 on most hosts, and a listener on 127.0.0.1 (the default) used to be reached only
// at ::1, refused until the deadline. Here in a forked child with a private /etc/hosts (a mount
// namespace), where "cofab-dual" is ::1 and then 127.0.0.1.
TEST(TcpTest, ConnectTriesEveryAddressTheNameResolvesTo) {
  const std::string hosts = ::testing::TempDir() + "cofab-hosts-" + std::to_string(::getpid());
  std::ofstream(hosts) << "::1 cofab-dual\n127.0.0.1 cofab-dual\n";
  enum : int { kOk = 0, kFailed = 1, kNoNamespace = 77, kNotV6First = 78 };
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int code = [&] {
      if (::unshare(CLONE_NEWNS) != 0 ||
          ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount(hosts.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
        return int{kNoNamespace};
      }
      auto all = tcp::resolveAddresses("cofab-dual:1");
      if (!all.ok() || all->size() < 2 || all->front().family() != AF_INET6) {
        return int{kNotV6First};
      }
      auto s = tcp::createContext({.localId = "s"});
      auto c = tcp::createContext({.localId = "c"});
      if (!s.ok() || !c.ok()) return int{kFailed};
      auto l = (*s)->listen({});  // 127.0.0.1
      if (!l.ok()) return int{kFailed};
      const std::string address = (*l)->address();
      const std::string port = address.substr(address.rfind(':') + 1);
      auto conn = (*c)->connect("cofab-dual:" + port, {}, Deadline::afterMs(5000));
      if (!conn.ok()) std::fprintf(stderr, "connect: %s\n", conn.status().toString().c_str());
      return int{conn.ok() ? kOk : kFailed};
    }();
    std::fflush(stderr);
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::filesystem::remove(hosts);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kNoNamespace) {
    GTEST_SKIP() << "cannot bind a private /etc/hosts (needs root and mount namespaces)";
  }
  if (WEXITSTATUS(status) == kNotV6First) {
    GTEST_SKIP() << "this resolver does not give ::1 first for the test name";
  }
  EXPECT_EQ(WEXITSTATUS(status), kOk) << "the connect did not reach 127.0.0.1";
}

// Closing the whole context must not lose a message whose send completed: here the message
// still sits in the sender's socket (the receiver's small buffer is full, it is not reading)
// when the sender's context closes and joins, and then the receiver sends something back.
// The lingering close used to end with the context's loops (one drain, then close), so that
// later message met a closed socket, whose RST threw the rest of the message away.
TEST(TcpTest, AMessageSentBeforeTheContextClosesSurvivesThePeersLaterSend) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p, {.localId = "s"}, {.socketBufferBytes = 64 << 10},
                                         {.localId = "c"}, {.socketBufferBytes = 8 << 20}));
  auto [client, server] = p.conn;
  // Larger than the receiver's buffers, within what the sender's may hold without root (the
  // kernel caps SO_SNDBUF at wmem_max, 2 x 208 KiB by default).
  const auto src = pattern(320 << 10, 21);
  Recorder sent;
  client->send(wire::Header{}, src.data(), src.size(), sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  ASSERT_TRUE(sent.statuses()[0].ok()) << sent.statuses()[0];
  p.client->close();
  p.client->join();
  const auto reply = pattern(1000, 22);
  Recorder replied;
  server->send(wire::Header{}, reply.data(), reply.size(), replied.sendCb());
  ASSERT_TRUE(replied.wait(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the reply has arrived there
  std::vector<uint8_t> dst(src.size());
  Recorder got;
  server->recv(dst.data(), dst.size(), got.recvCb());
  ASSERT_TRUE(got.wait(1));
  EXPECT_TRUE(got.statuses()[0].ok()) << got.statuses()[0];
  EXPECT_TRUE(dst == src);
}

TEST(TcpTest, AConnectRetryingWhenItsContextClosesIsCancelled) {
  auto ctx = tcp::createContext({.localId = "c"}, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  // A port nobody listens on: bound, then released.
  auto probe = tcp::createContext({.localId = "p"}, {});
  ASSERT_TRUE(probe.ok());
  auto l = (*probe)->listen({});
  ASSERT_TRUE(l.ok());
  const std::string address = (*l)->address();
  (*l)->close();
  (*probe)->close();
  auto connecting = std::async(std::launch::async, [&] {
    return (*ctx)->connect(address, {}, Deadline::afterMs(60000));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it is retrying by now
  (*ctx)->close();
  ASSERT_EQ(connecting.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const auto r = connecting.get();
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status();
  EXPECT_NE(r.status().message().find("closed"), std::string::npos) << r.status();
  (*ctx)->join();
}

// A listener whose kernel completes the TCP handshake but that never answers the Hello (a
// plain listen() socket here; a stopped process or a paused accept in life): closing the
// context ends the connect at once. Only the connect(2) wait used to check for a closed
// context; the Hello exchange waited for the whole attempt (here set to 2 minutes).
TEST(TcpTest, ClosingTheContextEndsAConnectStuckInTheHandshake) {
  ::setenv("COFAB_TCP_CONNECT_TIMEOUT_MS", "120000", 1);
  auto ctx = tcp::createContext({.localId = "c"}, {});
  ::unsetenv("COFAB_TCP_CONNECT_TIMEOUT_MS");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(silent, 8), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto connecting = std::async(std::launch::async, [&] {
    return (*ctx)->connect(address, {}, Deadline::afterMs(90000));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // waiting for the HelloAck
  (*ctx)->close();
  ASSERT_EQ(connecting.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the connect still waits for the silent listener's answer";
  const auto r = connecting.get();
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status();
  ::close(silent);
  (*ctx)->join();
}

// accept4() failing with EMFILE (the process is out of descriptors) is transient: the listener
// pauses and accepts again once descriptors are free. It used to close itself for good:
// accept() said Cancelled "listener ... is closed" and peers were refused from then on.
TEST(TcpTest, AListenerOutOfDescriptorsAcceptsAgainOnceSomeAreFree) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes need free descriptors for their own checks (UBSan's "
                  "vptr check tests memory through a pipe and reports a false 'invalid vptr' "
                  "without one), and this test takes them all away";
#endif
  auto server = tcp::createContext({.localId = "s"}, {});
  auto client = tcp::createContext({.localId = "c"}, {});
  ASSERT_TRUE(server.ok() && client.ok());
  auto l = (*server)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  auto addr = tcp::parseAddress((*l)->address());
  ASSERT_TRUE(addr.ok());
  const int raw = ::socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);  // made before the limit
  ASSERT_GE(raw, 0);
  cofab::testing::DescriptorHog hog;  // every descriptor taken
  ASSERT_TRUE(hog.ok());
  ASSERT_EQ(::connect(raw, addr->get(), addr->len), 0);  // the kernel completes it: accept4 fails
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  hog.release();
  ::close(raw);
  ConnectOptions co;
  co.localId = "c";
  auto c = (*client)->connect((*l)->address(), co, Deadline::afterMs(20000));
  ASSERT_TRUE(c.ok()) << c.status();
  auto a = (*l)->accept(Deadline::afterMs(20000));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peerId(), "c");
  (*client)->close();
  (*server)->close();
  (*client)->join();
  (*server)->join();
}

// A peer whose name does not resolve (yet) is retried until the connect deadline, like a
// refused connection, and DeadlineExceeded names the resolver's answer; it used to fail at once
// with InvalidArgument. (".invalid" never resolves, RFC 6761.)
TEST(TcpTest, AHostThatDoesNotResolveIsRetriedUntilTheDeadline) {
  auto ctx = tcp::createContext({.localId = "c"}, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const auto start = std::chrono::steady_clock::now();
  auto c = (*ctx)->connect("no-such-host.invalid:7000", {.localId = "c"}, Deadline::afterMs(1000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_NE(c.status().message().find("cannot resolve host 'no-such-host.invalid'"),
            std::string::npos)
      << c.status();
  // Not a timing threshold: it waited for its deadline instead of returning at once.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  (*ctx)->close();
  (*ctx)->join();
}

// A socket closed with input it never read makes the kernel send a RST, and the RST discards
// what is still in its send queue: the last messages a process sends before closing (an error
// reply, a Goodbye) would be lost although send() completed OK. Here the client's last message
// is bigger than the server's receive window (the server reads nothing until the close), so part
// of it is still queued in the client's kernel when the client closes with the server's message
// unread.
TEST(TcpTest, AMessageSentBeforeCloseArrivesWhenTheCloserHasUnreadInput) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p, {.localId = "s"}, {}, {.localId = "c"},
                                         {.socketBufferBytes = 4 << 20}));
  std::vector<uint8_t> unread(64);
  Recorder serverSent;
  p.conn.server->send(wire::Header{.key = 1}, unread.data(), unread.size(), serverSent.sendCb());
  ASSERT_TRUE(serverSent.wait(1));
  ASSERT_TRUE(serverSent.statuses()[0].ok()) << serverSent.statuses()[0];

  std::vector<uint8_t> last(2 << 20);
  std::iota(last.begin(), last.end(), uint8_t{7});
  Recorder clientSent;
  p.conn.client->send(wire::Header{.key = 2}, last.data(), last.size(), clientSent.sendCb());
  ASSERT_TRUE(clientSent.wait(1));
  ASSERT_TRUE(clientSent.statuses()[0].ok()) << clientSent.statuses()[0];
  p.conn.client->close();

  std::vector<uint8_t> got(last.size());
  Recorder received;
  p.conn.server->recv(got.data(), got.size(), received.recvCb());
  ASSERT_TRUE(received.wait(1));
  ASSERT_TRUE(received.statuses()[0].ok()) << received.statuses()[0];
  EXPECT_EQ(received.headers()[0].key, 2u);
  EXPECT_TRUE(got == last);
  // After the message the server sees the close itself, not a reset.
  Recorder after;
  p.conn.server->recv(got.data(), got.size(), after.recvCb());
  ASSERT_TRUE(after.wait(1));
  EXPECT_EQ(after.statuses()[0].code(), StatusCode::kRemoteError);
  EXPECT_NE(after.statuses()[0].message().find("closed the connection"), std::string::npos)
      << after.statuses()[0];
}

// A peer that sends a whole message and then resets the connection (a crash, an abortive
// close): the message is already in this side's receive queue, and a receive posted after the
// reset still gets it. The reset used to fail the connection as soon as its event arrived with
// no receive posted, dropping the message.
TEST(TcpTest, AMessageThatArrivedBeforeAResetIsStillReceived) {
  RawPeerPair p;
  ASSERT_NO_FATAL_FAILURE(acceptRawPeer(&p));
  const int fd = p.fd;
  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5, 6, 7, 8};
  // One write: a second small write could wait behind Nagle and be lost with the reset.
  const auto h = wire::encodeHeader(wire::Header{.key = 9, .payloadLength = payload.size()});
  std::vector<uint8_t> message(h.begin(), h.end());
  message.insert(message.end(), payload.begin(), payload.end());
  ASSERT_EQ(::write(fd, message.data(), message.size()), 72);
  const linger abortive{.l_onoff = 1, .l_linger = 0};
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive)), 0);
  ::close(fd);  // unread HelloAck + SO_LINGER 0: a RST
  // The reset's event reaches the server's loop before anything is posted, and is known there
  // (a caller polling status() for liveness is told), while the message stays receivable.
  for (const Deadline d = testDeadline(); p.conn->status().ok() && !d.expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(p.conn->status().code(), StatusCode::kRemoteError) << p.conn->status();
  std::vector<uint8_t> got(payload.size());
  Recorder rec;
  p.conn->recv(got.data(), got.size(), rec.recvCb());
  ASSERT_TRUE(rec.wait(1));
  ASSERT_TRUE(rec.statuses()[0].ok()) << rec.statuses()[0];
  EXPECT_EQ(rec.headers()[0].key, 9u);
  EXPECT_EQ(got, payload);
  Recorder after;
  p.conn->recv(got.data(), got.size(), after.recvCb());
  ASSERT_TRUE(after.wait(1));
  EXPECT_EQ(after.statuses()[0].code(), StatusCode::kRemoteError) << after.statuses()[0];
  // The same Status as status(): the first error is sticky (connection.h). The receive got
  // "closed the connection" from the read that met the end, while status() said the reset.
  EXPECT_EQ(after.statuses()[0].message(), p.conn->status().message());
}

// close() from a receive's callback ends the connection there: a receive posted behind it fails
// with Cancelled even when its message is already in the same read. The read loop went on and
// completed it OK after close() had returned (status() already said Cancelled).
TEST(TcpTest, CloseFromACallbackCancelsTheReceivesBehindIt) {
  RawPeerPair p;
  ASSERT_NO_FATAL_FAILURE(acceptRawPeer(&p));
  const int fd = p.fd;
  std::shared_ptr<Connection> conn = p.conn;
  uint8_t first[8], second[8];
  Recorder rec;
  conn->recv(first, sizeof(first), [&rec, conn](const Status& st, const wire::Header& h) {
    conn->close();
    rec.record(st, h, 0);
  });
  conn->recv(second, sizeof(second), rec.recvCb(1));
  std::vector<uint8_t> both;  // two whole messages in one write: one read takes both
  for (uint64_t key : {1, 2}) {
    const auto h = wire::encodeHeader(wire::Header{.key = key, .payloadLength = 8});
    both.insert(both.end(), h.begin(), h.end());
    both.insert(both.end(), 8, static_cast<uint8_t>(key));
  }
  ASSERT_EQ(::write(fd, both.data(), both.size()), static_cast<ssize_t>(both.size()));
  ASSERT_TRUE(rec.wait(2));
  EXPECT_TRUE(rec.statuses()[0].ok()) << rec.statuses()[0];
  EXPECT_EQ(rec.statuses()[1].code(), StatusCode::kCancelled) << rec.statuses()[1];
  ::close(fd);
}

// The same, with a send posted after the reset and before the receives: the send fails with
// the connection's sticky error, and the message that arrived before the reset is still
// received. The failing write used to close the socket with the message unread and fail the
// receives with "sendmsg: Broken pipe".
TEST(TcpTest, ASendAfterAResetDoesNotDiscardTheMessagesThatArrivedBeforeIt) {
  RawPeerPair p;
  ASSERT_NO_FATAL_FAILURE(acceptRawPeer(&p));
  const int fd = p.fd;
  const std::vector<uint8_t> payload = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto h = wire::encodeHeader(wire::Header{.key = 9, .payloadLength = payload.size()});
  std::vector<uint8_t> message(h.begin(), h.end());
  message.insert(message.end(), payload.begin(), payload.end());
  ASSERT_EQ(::write(fd, message.data(), message.size()), 72);
  const linger abortive{.l_onoff = 1, .l_linger = 0};
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abortive, sizeof(abortive)), 0);
  ::close(fd);
  for (const Deadline d = testDeadline(); p.conn->status().ok() && !d.expired();) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const Status sticky = p.conn->status();
  ASSERT_EQ(sticky.code(), StatusCode::kRemoteError) << sticky;
  std::vector<uint8_t> out(64, 7);
  Recorder sent;
  p.conn->send(wire::Header{.key = 1, .payloadLength = out.size()}, out.data(), out.size(),
               sent.sendCb());
  ASSERT_TRUE(sent.wait(1));
  EXPECT_EQ(sent.statuses()[0].code(), sticky.code()) << sent.statuses()[0];
  std::vector<uint8_t> got(payload.size());
  Recorder rec;
  p.conn->recv(got.data(), got.size(), rec.recvCb());
  ASSERT_TRUE(rec.wait(1));
  ASSERT_TRUE(rec.statuses()[0].ok()) << rec.statuses()[0];
  EXPECT_EQ(got, payload);
  Recorder after;
  p.conn->recv(got.data(), got.size(), after.recvCb());
  ASSERT_TRUE(after.wait(1));
  EXPECT_EQ(after.statuses()[0].code(), StatusCode::kRemoteError) << after.statuses()[0];
}

TEST(TcpTest, IdleAndClosedObjectsDoNotSpin) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p));
  p.listener->close();
  p.conn.client->close();  // the accepted end now sees EOF with nothing posted
  const double before = ioThreadCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(ioThreadCpuSeconds() - before, 0.1) << "I/O threads are busy while nothing happens";
}

}  // namespace
}  // namespace cofab::transport::testing

namespace cofab::transport::testing {
namespace {

// COFAB_TCP_SOCKETS_PER_PEER > 1: one Connection over several sockets. Messages of very
// different sizes go round-robin, so the sockets finish them out of order; the connection must
// still match messages to receives and complete callbacks in posting order.
TEST(TcpStripedTest, MessagesStayInOrderAcrossSockets) {
  TcpPair p;
  ASSERT_NO_FATAL_FAILURE(connectTcpPair(&p, {.localId = "s"}, {.loops = 2}, {.localId = "c"},
                                         {.loops = 3, .socketsPerPeer = 4},
                                         {.localId = "striper"}));
  const auto& cc = p.conn.client;
  const auto& a = p.conn.server;
  EXPECT_EQ(a->peerId(), "striper");
  EXPECT_NE(cc->describe().find("over 4 sockets"), std::string::npos) << cc->describe();
  EXPECT_NE(a->describe().find("over 4 sockets"), std::string::npos) << a->describe();
  constexpr size_t kMessages = 40;
  std::vector<std::vector<uint8_t>> src, dst;
  for (size_t i = 0; i < kMessages; ++i) {
    const size_t size = i % 4 == 0 ? (2u << 20) + i : i * 3;  // big ones on socket 0 only
    src.push_back(pattern(size, static_cast<uint32_t>(i)));
    dst.emplace_back(size, 0xEE);
  }
  Recorder sends, recvs;
  for (size_t i = 0; i < kMessages; ++i) {
    InsideCall inside;
    a->recv(dst[i].data(), dst[i].size(), recvs.recvCb(i));
  }
  for (size_t i = 0; i < kMessages; ++i) {
    InsideCall inside;
    wire::Header h;
    h.sequence = i;
    cc->send(h, src[i].data(), src[i].size(), sends.sendCb(i));
  }
  ASSERT_TRUE(sends.wait(kMessages));
  ASSERT_TRUE(recvs.wait(kMessages));
  EXPECT_EQ(sends.inlineCalls() + recvs.inlineCalls(), 0);
  std::vector<size_t> inOrder(kMessages);
  std::iota(inOrder.begin(), inOrder.end(), size_t{0});
  EXPECT_EQ(sends.order(), inOrder);
  EXPECT_EQ(recvs.order(), inOrder);
  for (size_t i = 0; i < kMessages; ++i) {
    EXPECT_TRUE(recvs.statuses()[i].ok()) << recvs.statuses()[i];
    EXPECT_EQ(recvs.headers()[i].sequence, i);
    EXPECT_TRUE(dst[i] == src[i]) << "message " << i;
  }
}

// A peer whose sockets do not form a valid group (here: two sockets claiming the same index of
// one token) is dropped by the listener, which keeps accepting well-formed connections.
TEST(TcpStripedTest, AnInconsistentGroupIsDroppedAndTheListenerKeepsServing) {
  auto s = tcp::createContext({.localId = "s"});
  ASSERT_TRUE(s.ok());
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok());
  auto addr = tcp::parseAddress((*l)->address());
  ASSERT_TRUE(addr.ok());
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    const int fd = ::socket(addr->family(), SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, addr->get(), addr->len), 0);
    wire::Header hello;
    hello.type = wire::MessageType::kHello;
    hello.key = 0x5eed;
    hello.chunkIndex = 0;  // both claim socket 0 of 2
    hello.chunkCount = 2;
    auto b = wire::encodeHeader(hello);
    ASSERT_EQ(::write(fd, b.data(), b.size()), 64);
    uint8_t ack[64];
    ASSERT_EQ(::read(fd, ack, sizeof(ack)), 64);  // each socket's handshake itself succeeds
    fds.push_back(fd);
  }
  auto c = tcp::createContext({.localId = "c"}, {.socketsPerPeer = 2});
  ASSERT_TRUE(c.ok());
  auto cc = (*c)->connect((*l)->address(), {.localId = "good"}, testDeadline());
  ASSERT_TRUE(cc.ok()) << cc.status();
  auto a = (*l)->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peerId(), "good");
  for (int fd : fds) ::close(fd);
}

// Raw striped handshakes: a group whose first socket to arrive is not socket 0 (so its slot 0
// is empty) outlives the incomplete-group bound and is purged, and a socket of the same token
// claims a larger group than the one parked. Neither may crash the listener (the purge's log
// line read slot 0; the size check came after indexing), and it keeps serving.
TEST(TcpStripedTest, MalformedGroupsArePurgedWithoutCrashingTheListener) {
  // Incomplete groups go after 1 s. (Not much less: the same bound applies to every handshake
  // below, the good one included, and a loaded machine under ASan can stall one for tens of ms.)
  ::setenv("COFAB_TCP_CONNECT_TIMEOUT_MS", "500", 1);
  auto s = tcp::createContext({.localId = "s"});
  ::unsetenv("COFAB_TCP_CONNECT_TIMEOUT_MS");
  ASSERT_TRUE(s.ok());
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok());
  auto addr = tcp::parseAddress((*l)->address());
  ASSERT_TRUE(addr.ok());
  std::vector<int> fds;
  auto hello = [&](uint64_t token, uint32_t index, uint32_t count) {
    const int fd = ::socket(addr->family(), SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, addr->get(), addr->len), 0);
    wire::Header h;
    h.type = wire::MessageType::kHello;
    h.key = token;
    h.chunkIndex = index;
    h.chunkCount = count;
    auto b = wire::encodeHeader(h);
    ASSERT_EQ(::write(fd, b.data(), b.size()), 64);
    uint8_t ack[64];
    ASSERT_EQ(::read(fd, ack, sizeof(ack)), 64);
    fds.push_back(fd);
  };
  hello(0xabc, 1, 2);  // socket 1 of 2 first: slot 0 stays empty
  hello(0xdef, 0, 2);
  hello(0xdef, 5, 8);  // the same token, a larger group
  for (int fd : fds) {  // dropped: the misfit at once, the incomplete group by the timer
    EXPECT_TRUE(closedByPeer(fd, testDeadline()));
  }
  hello(0x123, 0, 2);  // parked while the listener serves the next connection
  auto c = tcp::createContext({.localId = "c"});
  ASSERT_TRUE(c.ok());
  auto cc = (*c)->connect((*l)->address(), {.localId = "good"}, testDeadline());
  ASSERT_TRUE(cc.ok()) << cc.status();
  auto a = (*l)->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peerId(), "good");
  for (int fd : fds) ::close(fd);
}

TEST(TcpStripedTest, SocketCountIsValidated) {
  ScopedParamOverride o("COFAB_TCP_SOCKETS_PER_PEER", "65");
  EXPECT_EQ(tcp::createContext({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tcp::createContext({}, {.socketsPerPeer = 65}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab::transport::testing

namespace cofab::transport::testing {
namespace {

// A peer that connects and sends nothing, or half a Hello, must not hold a socket and a
// handshake in the listener forever: it is dropped after COFAB_TCP_CONNECT_TIMEOUT_MS (the bound
// the connecting side itself puts on connect + handshake), and the listener keeps serving.
TEST(TcpTest, AHandshakeThatNeverCompletesIsDroppedAfterTheConnectTimeout) {
  // Long enough for the good handshake at the end on a loaded machine, short for the test.
  ScopedParamOverride o("COFAB_TCP_CONNECT_TIMEOUT_MS", "500");
  auto s = tcp::createContext({.localId = "s"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  const int silent = rawConnect(**l);
  ASSERT_GE(silent, 0);
  const int half = rawConnect(**l);
  ASSERT_GE(half, 0);
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  auto b = wire::encodeHeader(hello);
  ASSERT_EQ(::write(half, b.data(), 20), 20);
  EXPECT_TRUE(closedByPeer(silent, testDeadline())) << "a silent peer's socket is still open";
  EXPECT_TRUE(closedByPeer(half, testDeadline())) << "a half handshake's socket is still open";
  ::close(silent);
  ::close(half);
  auto c = tcp::createContext({.localId = "c"});
  ASSERT_TRUE(c.ok());
  auto cc = (*c)->connect((*l)->address(), {.localId = "good"}, testDeadline());
  ASSERT_TRUE(cc.ok()) << cc.status();
  auto a = (*l)->accept(testDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peerId(), "good");
}

// A striped group whose other sockets never arrive is dropped by a timer (after twice
// COFAB_TCP_CONNECT_TIMEOUT_MS), not only when some later group happens to arrive: its parked
// socket is closed.
TEST(TcpStripedTest, AnIncompleteGroupIsDroppedByATimer) {
  ScopedParamOverride o("COFAB_TCP_CONNECT_TIMEOUT_MS", "500");
  auto s = tcp::createContext({.localId = "s"});
  ASSERT_TRUE(s.ok()) << s.status();
  auto l = (*s)->listen({});
  ASSERT_TRUE(l.ok()) << l.status();
  const int fd = rawConnect(**l);
  ASSERT_GE(fd, 0);
  wire::Header hello;
  hello.type = wire::MessageType::kHello;
  hello.key = 0xfeed;
  hello.chunkIndex = 0;  // socket 0 of 2; socket 1 never comes
  hello.chunkCount = 2;
  auto b = wire::encodeHeader(hello);
  ASSERT_EQ(::write(fd, b.data(), b.size()), 64);
  uint8_t ack[64];
  ASSERT_EQ(::read(fd, ack, sizeof(ack)), 64);  // handshaken: the socket waits for its group
  EXPECT_TRUE(closedByPeer(fd, testDeadline())) << "the incomplete group's socket is still open";
  ::close(fd);
}

}  // namespace
}  // namespace cofab::transport::testing
