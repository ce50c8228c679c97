// The TcpStore client against a scripted server: what it sends on a retry, and how it takes
// replies that time out or break the protocol.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <thread>

#include "fabric/rendezvous/tcp_socket.h"
#include "fabric/rendezvous/tcp_store.h"
#include "fabric/rendezvous/tcp_store_protocol.h"
#include "fabric/rendezvous/tcp_store_server.h"

namespace cofab {
namespace {

using store_proto::Reader;
using store_proto::Writer;

// A store server whose answers the test writes. Serves one connection at a time; for every
// request frame it calls `answer(connection index, request body)` and writes back the bytes it
// returns, or closes the connection when they are empty.
class ScriptedServer {
 public:
  using Answer = std::function<Bytes(int connection, const Bytes& request)>;
  explicit ScriptedServer(Answer answer) : answer_(std::move(answer)) {
    auto fd = listenTcp(HostPort{"127.0.0.1", 0}, 8, &port_);
    COFAB_CHECK(fd.ok()) << fd.status();
    listenFd_ = *fd;
    ::fcntl(listenFd_, F_SETFL, 0);  // blocking: the thread waits in accept()
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedServer() {
    ::shutdown(listenFd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    ::close(listenFd_);
  }
  uint16_t port() const { return port_; }
  std::vector<Bytes> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  void serve() {
    for (int connection = 0;; ++connection) {
      const int fd = ::accept(listenFd_, nullptr, nullptr);
      if (fd < 0) return;
      while (true) {
        uint8_t header[store_proto::kFrameHeaderBytes];
        if (!recvAll(fd, header, sizeof(header), Deadline::afterMs(60000), "client").ok()) break;
        auto len = store_proto::parseFrameHeader(header, store_proto::kRequestMagic);
        COFAB_CHECK(len.ok()) << len.status();
        Bytes body(*len);
        if (!recvAll(fd, body.data(), body.size(), Deadline::afterMs(60000), "client").ok()) break;
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(body);
        }
        const Bytes reply = answer_(connection, body);
        if (reply.empty()) break;
        if (!sendAll(fd, reply.data(), reply.size(), Deadline::afterMs(60000), "client").ok()) {
          break;
        }
      }
      ::close(fd);
    }
  }

  Answer answer_;
  uint16_t port_ = 0;
  int listenFd_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Bytes> requests_;
};

// The server-side wait (ms) at the end of a wait request for one key.
uint32_t waitTimeoutOf(const Bytes& request) {
  Reader r(request.data(), request.size());
  r.u8().value();   // op
  r.u32().value();  // key count
  r.str().value();  // the key
  return r.u32().value();
}

Bytes timeoutReply(const std::string& key) {
  Writer w;
  w.u8(static_cast<uint8_t>(store_proto::Reply::kTimeout));
  w.u32(1);
  w.str(key);
  return w.frame(store_proto::kResponseMagic);
}

// The connection drops after the wait request went out; the client resends it on a new one.
// The resent request must carry what is left of the caller's deadline, not the original
// timeout: the server would otherwise wait past the caller's deadline, and the caller would get
// a bare socket timeout instead of the server's answer naming the missing key.
TEST(TcpStoreClientTest, ARetriedWaitSendsTheRemainingTime) {
  ScriptedServer server([](int connection, const Bytes&) {
    return connection == 0 ? Bytes{} : timeoutReply("k");  // first: drop the connection
  });
  auto client = TcpStore::connect("127.0.0.1", server.port(), {}, Deadline::afterMs(20000));
  ASSERT_TRUE(client.ok()) << client.status();
  Status s = (*client)->wait({"k"}, Deadline::afterMs(20000));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("'k'"), std::string::npos) << s;
  auto requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  const uint32_t first = waitTimeoutOf(requests[0]), second = waitTimeoutOf(requests[1]);
  EXPECT_LE(first, 20000u);
  // At least the client's reconnect backoff (10 ms) passed between the two.
  EXPECT_LT(second, first) << "the retry sent the original timeout again";
}

// A server that drops the connection at every request never answers the wait: the client
// retries until the caller's deadline passes, and the error still names the keys it waited for.
TEST(TcpStoreClientTest, AWaitThatTimesOutWithoutAnAnswerNamesTheKeys) {
  ScriptedServer server([](int, const Bytes&) { return Bytes{}; });
  auto client = TcpStore::connect("127.0.0.1", server.port(), {}, Deadline::afterMs(20000));
  ASSERT_TRUE(client.ok()) << client.status();
  Status s = (*client)->wait({"first", "second"}, Deadline::afterMs(100));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("'first', 'second'"), std::string::npos) << s;
  auto v = (*client)->get("third", Deadline::afterMs(100));
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_NE(v.status().message().find("'third'"), std::string::npos) << v.status();
}

Bytes rawFrame(uint32_t magic, uint32_t len, const Bytes& body) {
  Bytes out(8);
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<uint8_t>(magic >> (8 * i));
    out[4 + i] = static_cast<uint8_t>(len >> (8 * i));
  }
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// A reply frame announcing more than the protocol allows is DataLoss at once: nothing that size
// is allocated or read, and the request is not resent (the server would answer it the same way)
// until the deadline turns it into a vague DeadlineExceeded. Likewise a frame of another
// protocol (bad magic).
TEST(TcpStoreClientTest, AReplyFrameOverTheLimitIsDataLossNotARetry) {
  for (uint32_t magic : {store_proto::kResponseMagic, 0x50545448u /* "HTTP" */}) {
    SCOPED_TRACE(magic);
    ScriptedServer server([magic](int, const Bytes&) {
      const auto tooLong = static_cast<uint32_t>(store_proto::kMaxBodyBytes + 1);
      return rawFrame(magic, magic == store_proto::kResponseMagic ? tooLong : 4, {0, 0, 0, 0});
    });
    auto client = TcpStore::connect("127.0.0.1", server.port(), {}, Deadline::afterMs(20000));
    ASSERT_TRUE(client.ok()) << client.status();
    auto v = (*client)->get("k", Deadline::afterMs(5000));
    EXPECT_EQ(v.status().code(), StatusCode::kDataLoss) << v.status();
    EXPECT_EQ(server.requests().size(), 1u) << "the request was resent";
  }
}

// Result fields that overrun the reply, or bytes left after them: DataLoss naming the store,
// not the decoder's InvalidArgument (which reads as the caller's mistake), nor a value read
// from past the result.
TEST(TcpStoreClientTest, AMalformedResultIsDataLoss) {
  ScriptedServer server([](int, const Bytes& request) {
    Writer w;
    w.u8(static_cast<uint8_t>(store_proto::Reply::kOk));
    if (request[0] == static_cast<uint8_t>(store_proto::Op::kGet)) {
      w.u32(1000);  // a value of 1000 bytes, of which 3 follow
      w.u8('a');
      w.u8('b');
      w.u8('c');
    } else {  // add: the counter, then a stray byte
      w.i64(7);
      w.u8(0);
    }
    return w.frame(store_proto::kResponseMagic);
  });
  auto client = TcpStore::connect("127.0.0.1", server.port(), {}, Deadline::afterMs(20000));
  ASSERT_TRUE(client.ok()) << client.status();
  auto v = (*client)->get("k", Deadline::afterMs(5000));
  EXPECT_EQ(v.status().code(), StatusCode::kDataLoss) << v.status();
  EXPECT_NE(v.status().message().find("127.0.0.1"), std::string::npos) << v.status();
  auto n = (*client)->add("n", 1);
  EXPECT_EQ(n.status().code(), StatusCode::kDataLoss) << n.status();
}

// Timeout and error replies are checked like results: a timeout to a request that cannot time
// out, a key list cut short or followed by stray bytes, an unknown error code and a non-empty
// answer to set are the server's fault (DataLoss), not a timeout or the caller's error.
TEST(TcpStoreClientTest, MalformedTimeoutAndErrorRepliesAreDataLoss) {
  ScriptedServer server([](int, const Bytes& request) {
    Writer w;
    switch (static_cast<store_proto::Op>(request[0])) {
      case store_proto::Op::kGet:  // three keys announced, one follows
        w.u8(static_cast<uint8_t>(store_proto::Reply::kTimeout));
        w.u32(3);
        w.str("k");
        break;
      case store_proto::Op::kWait:  // a whole list, then a stray byte
        w.u8(static_cast<uint8_t>(store_proto::Reply::kTimeout));
        w.u32(1);
        w.str("k");
        w.u8(0);
        break;
      case store_proto::Op::kAdd:  // a timeout to a request that cannot time out
        w.u8(static_cast<uint8_t>(store_proto::Reply::kTimeout));
        w.u32(0);
        break;
      case store_proto::Op::kRemove:  // an error code no version defines
        w.u8(static_cast<uint8_t>(store_proto::Reply::kError));
        w.u8(200);
        w.str("?");
        break;
      default:  // set: OK with a result set never has
        w.u8(static_cast<uint8_t>(store_proto::Reply::kOk));
        w.u8(1);
    }
    return w.frame(store_proto::kResponseMagic);
  });
  auto client = TcpStore::connect("127.0.0.1", server.port(), {}, Deadline::afterMs(20000));
  ASSERT_TRUE(client.ok()) << client.status();
  Store& s = **client;
  EXPECT_EQ(s.get("k", Deadline::afterMs(5000)).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.wait({"k"}, Deadline::afterMs(5000)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.add("n", 1).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.remove("k").status().code(), StatusCode::kDataLoss);
  const Status set = s.set("k", toBytes("v"));
  EXPECT_EQ(set.code(), StatusCode::kDataLoss) << set;
}

// A wait or check whose key list is over the protocol's body limit fails at once, naming the
// limit; the server used to drop each attempt as a protocol error until the deadline.
TEST(TcpStoreClientTest, AKeyListOverTheBodyLimitIsRefusedAtOnce) {
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok());
  auto client = TcpStore::connect("127.0.0.1", (*server)->port(), {}, Deadline::afterMs(5000));
  ASSERT_TRUE(client.ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 33000; ++i) {
    std::string k = std::to_string(i);
    keys.push_back(k + std::string(kMaxStoreKeyBytes - k.size(), 'x'));
  }
  const Status w = (*client)->wait(keys, Deadline::afterMs(60000));
  EXPECT_EQ(w.code(), StatusCode::kInvalidArgument) << w;
  EXPECT_NE(w.message().find("limit"), std::string::npos) << w;
  EXPECT_EQ((*client)->check(keys).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*server)->stats().protocolErrors, 0u);
}

// A store host whose name does not resolve (yet) is retried until the deadline, like a refused
// connection: a master's DNS record may appear only once it runs. It used to fail at once with
// InvalidArgument. (".invalid" never resolves, RFC 6761.)
TEST(TcpStoreClientTest, AHostThatDoesNotResolveIsRetriedUntilTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto fd = connectTcp(HostPort{"no-such-host.invalid", 1}, Deadline::afterMs(1000));
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kDeadlineExceeded) << fd.status();
  EXPECT_NE(fd.status().message().find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
      << fd.status();
  // Not a timing threshold: the call must have waited for its deadline rather than return at
  // once.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
}

// An address that drops SYNs (here: a listener whose accept queue is full) gets 2 s slices,
// not the whole deadline: with several addresses (an AAAA record behind a firewall first) the
// others are tried, and each round resolves the name again. The attempt count says which.
TEST(TcpStoreClientTest, AnAddressThatDropsSynsIsTriedInSlicesNotForTheWholeDeadline) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t port = ntohs(a.sin_port);
  auto filler = connectTcp(HostPort{"127.0.0.1", port}, Deadline::afterMs(5000));  // queue full
  ASSERT_TRUE(filler.ok()) << filler.status();
  auto fd = connectTcp(HostPort{"127.0.0.1", port}, Deadline::afterMs(3000));
  ::close(*filler);
  ::close(listener);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kDeadlineExceeded);
  const std::string& m = fd.status().message();
  const size_t at = m.find(" attempts");
  ASSERT_NE(at, std::string::npos) << m;
  const size_t open = m.rfind('(', at);
  EXPECT_GE(std::stoi(m.substr(open + 1, at - open - 1)), 2) << m;
}

// One TcpStore shared by threads: a get that waits for a key does not hold up the other
// threads' calls, the set of that very key included. Calls used to be serialised over one
// connection: the set waited behind the get, and the get ran into its deadline.
TEST(TcpStoreClientTest, AWaitingGetDoesNotBlockOtherThreadsCalls) {
  auto server = TcpStoreServer::start({});
  ASSERT_TRUE(server.ok()) << server.status();
  auto store = TcpStore::connect("127.0.0.1", (*server)->port(), {}, Deadline::afterMs(5000));
  ASSERT_TRUE(store.ok()) << store.status();
  StatusOr<Bytes> got = Unavailable("not run");
  std::thread waiter([&] { got = (*store)->get("k", Deadline::afterMs(10000)); });
  // The get is parked on the server before the set is sent (else this tests nothing).
  for (int i = 0; i < 2000 && (*server)->stats().requests < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE((*store)->set("k", toBytes("v")).ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(toString(*got), "v");
}

}  // namespace
}  // namespace cofab
