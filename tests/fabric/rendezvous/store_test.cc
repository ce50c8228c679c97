// The Store contract, written once and run against every implementation.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>

#include "core/param.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/rendezvous/prefix_store.h"
#include "fabric/rendezvous/tcp_store.h"
#include "fabric/rendezvous/tcp_store_server.h"
#include "tests/support/forwarding_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace cofab {
namespace {

// Owns whatever a store needs to live (a server, a directory) and makes clients.
class StoreFactory {
 public:
  virtual ~StoreFactory() = default;
  virtual std::unique_ptr<Store> client() = 0;
};

// A non-owning handle on a shared store: every "client" of a HashStore is the store itself.
using SharedView = testing::ForwardingStore;

class HashFactory : public StoreFactory {
 public:
  std::unique_ptr<Store> client() override { return std::make_unique<SharedView>(&store_); }

 private:
  HashStore store_;
};

class FileFactory : public StoreFactory {
 public:
  std::unique_ptr<Store> client() override {
    return std::move(FileStore::open(dir_.path()).value());
  }

 private:
  testing::TempDir dir_;
};

class TcpFactory : public StoreFactory {
 public:
  TcpFactory() : server_(std::move(TcpStoreServer::start({}).value())) {}
  std::unique_ptr<Store> client() override {
    return std::move(
        TcpStore::connect("127.0.0.1", server_->port(), {}, Deadline::afterMs(5000)).value());
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "hash") factory_ = std::make_unique<HashFactory>();
    if (GetParam() == "file") factory_ = std::make_unique<FileFactory>();
    if (GetParam() == "tcp") factory_ = std::make_unique<TcpFactory>();
    store_ = factory_->client();
  }
  std::unique_ptr<StoreFactory> factory_;
  std::unique_ptr<Store> store_;
};

TEST_P(StoreContractTest, SetThenGetReturnsTheValue) {
  Bytes value = {0, 1, 2, 255, 0};
  ASSERT_TRUE(store_->set("k/with:odd chars", value).ok());
  auto got = store_->get("k/with:odd chars", Deadline::afterMs(1000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(store_->set("k/with:odd chars", toBytes("second")).ok());
  EXPECT_EQ(toString(*store_->get("k/with:odd chars", Deadline::afterMs(1000))), "second");
  ASSERT_TRUE(store_->set("empty", {}).ok());
  EXPECT_TRUE(store_->get("empty", Deadline::afterMs(1000))->empty());
}

TEST_P(StoreContractTest, GetWaitsForALaterSet) {
  auto other = factory_->client();
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(other->set("late", toBytes("here")).ok());
  });
  auto got = store_->get("late", Deadline::afterMs(10'000));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(toString(*got), "here");
}

TEST_P(StoreContractTest, GetTimesOutNamingTheKey) {
  auto got = store_->get("never-set", Deadline::afterMs(100));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("'never-set'"), std::string::npos) << got.status();
}

TEST_P(StoreContractTest, WaitNamesOnlyTheMissingKeys) {
  ASSERT_TRUE(store_->set("a", toBytes("1")).ok());
  Status s = store_->wait({"a", "b", "c"}, Deadline::afterMs(100));
  ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message().find("'a'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'b', 'c'"), std::string::npos) << s;
  ASSERT_TRUE(store_->set("b", {}).ok());
  ASSERT_TRUE(store_->set("c", {}).ok());
  EXPECT_TRUE(store_->wait({"a", "b", "c"}, Deadline::afterMs(1000)).ok());
  EXPECT_TRUE(*store_->check({"a", "b", "c"}));
  EXPECT_FALSE(*store_->check({"a", "zzz"}));
}

// A wait completes only when every key exists at once: one set and then removed while it
// waited for another does not count, and many waiters on the same keys are all released by
// the writes they wait for (the tcp server waits on one key at a time and re-checks the rest).
TEST_P(StoreContractTest, AWaitNeedsEveryKeyAtOnceAndReleasesEveryWaiter) {
  constexpr int kWaiters = 4;
  std::atomic<int> released{0};
  std::vector<Status> results(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      results[size_t(i)] = store_->wait({"x", "y"}, Deadline::afterMs(20000));
      released++;
    });
  }
  std::this_thread::sleep_for(Millis(50));  // parked, most likely (if not, the same must hold)
  ASSERT_TRUE(store_->set("x", toBytes("1")).ok());
  ASSERT_TRUE(*store_->remove("x"));
  ASSERT_TRUE(store_->set("y", toBytes("1")).ok());
  std::this_thread::sleep_for(Millis(50));
  EXPECT_EQ(released.load(), 0) << "a wait returned while 'x' was missing";
  ASSERT_TRUE(store_->set("x", toBytes("2")).ok());
  for (auto& t : waiters) t.join();
  for (const Status& r : results) EXPECT_TRUE(r.ok()) << r;
}

// A wait for no keys is answered at once (a one-rank communicator waits for every other
// rank's key: none). The tcp server's parking crashed on it.
TEST_P(StoreContractTest, AWaitForNoKeysReturnsAtOnce) {
  EXPECT_TRUE(store_->wait({}, Deadline::afterMs(5000)).ok());
  EXPECT_TRUE(*store_->check({}));
  EXPECT_TRUE(store_->set("after", toBytes("1")).ok());  // the server still serves
}

TEST_P(StoreContractTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 8, kAdds = 50;
  auto statuses = testing::runThreadRanks(kThreads, [&](int) -> Status {
    auto client = factory_->client();
    for (int i = 0; i < kAdds; ++i) COFAB_RETURN_IF_ERROR(client->add("counter", 1).status());
    return OkStatus();
  });
  ASSERT_TRUE(testing::allOk(statuses).ok()) << testing::allOk(statuses);
  EXPECT_EQ(*store_->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(*store_->add("counter", -kThreads * kAdds), 0);
  EXPECT_EQ(toString(*store_->get("counter", Deadline::afterMs(100))), "0");
}

TEST_P(StoreContractTest, AddOnANonCounterIsInvalidArgument) {
  ASSERT_TRUE(store_->set("text", toBytes("hello")).ok());
  auto r = store_->add("text", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'text'"), std::string::npos);
}

TEST_P(StoreContractTest, AddThatWouldOverflowIsRefusedAndKeepsTheValue) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ASSERT_EQ(*store_->add("big", kMax - 1), kMax - 1);
  auto r = store_->add("big", 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'big'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("overflow"), std::string::npos) << r.status();
  EXPECT_EQ(*store_->add("big", 1), kMax);  // the refused add changed nothing
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  ASSERT_EQ(*store_->add("small", kMin), kMin);
  EXPECT_EQ(store_->add("small", -1).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(StoreContractTest, CompareSetSwapsOnlyOnMatch) {
  // Absent key, expected "absent": swapped.
  EXPECT_EQ(toString(*store_->compareSet("cas", {}, toBytes("v1"))), "v1");
  // Wrong expectation: unchanged, returns current.
  EXPECT_EQ(toString(*store_->compareSet("cas", toBytes("nope"), toBytes("v2"))), "v1");
  EXPECT_EQ(toString(*store_->compareSet("cas", {}, toBytes("v2"))), "v1");
  // Right expectation: swapped.
  EXPECT_EQ(toString(*store_->compareSet("cas", toBytes("v1"), toBytes("v2"))), "v2");
  EXPECT_EQ(toString(*store_->get("cas", Deadline::afterMs(100))), "v2");
  // Absent key with a non-empty expectation: nothing is created.
  EXPECT_TRUE(store_->compareSet("absent", toBytes("x"), toBytes("y"))->empty());
  EXPECT_FALSE(*store_->check({"absent"}));
}

TEST_P(StoreContractTest, RemoveReportsWhetherTheKeyExisted) {
  ASSERT_TRUE(store_->set("gone", toBytes("x")).ok());
  EXPECT_TRUE(*store_->remove("gone"));
  EXPECT_FALSE(*store_->remove("gone"));
  EXPECT_FALSE(*store_->check({"gone"}));
}

TEST_P(StoreContractTest, BadKeysAndValuesAreInvalidArgument) {
  EXPECT_EQ(store_->set("", toBytes("x")).code(), StatusCode::kInvalidArgument);
  std::string longKey(kMaxStoreKeyBytes + 1, 'k');
  EXPECT_EQ(store_->set(longKey, toBytes("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->get("", Deadline::afterMs(10)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->wait({"ok", ""}, Deadline::afterMs(10)).code(), StatusCode::kInvalidArgument);
  Bytes huge(kMaxStoreValueBytes + 1);
  EXPECT_EQ(store_->set("huge", huge).code(), StatusCode::kInvalidArgument);
  // An `expected` no store could hold is the caller's mistake on every store (over tcp it used
  // to break the connection and be reported as an outcome unknown), and changes nothing.
  ASSERT_TRUE(store_->set("cas", toBytes("v")).ok());
  EXPECT_EQ(store_->compareSet("cas", huge, toBytes("w")).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(toString(*store_->get("cas", Deadline::afterMs(1000))), "v");
}

TEST_P(StoreContractTest, LongKeysAndLargeValuesWork) {
  std::string longKey(kMaxStoreKeyBytes, 'q');
  Bytes big(8 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 31 + 7);
  ASSERT_TRUE(store_->set(longKey, big).ok());
  auto got = store_->get(longKey, Deadline::afterMs(5000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, big);
}

TEST_P(StoreContractTest, PrefixStoresDoNotSeeEachOther) {
  PrefixStore a("job-a", store_.get()), b("job-b", store_.get());
  ASSERT_TRUE(a.set("x", toBytes("from a")).ok());
  ASSERT_TRUE(b.set("x", toBytes("from b")).ok());
  EXPECT_EQ(toString(*a.get("x", Deadline::afterMs(100))), "from a");
  EXPECT_EQ(toString(*b.get("x", Deadline::afterMs(100))), "from b");
  EXPECT_EQ(toString(*store_->get("job-a/x", Deadline::afterMs(100))), "from a");
  Status s = a.wait({"y"}, Deadline::afterMs(50));
  EXPECT_NE(s.message().find("'job-a/y'"), std::string::npos) << s;
  // An empty key is as invalid behind a prefix as anywhere else.
  EXPECT_EQ(a.set("", toBytes("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.wait({"x", ""}, Deadline::afterMs(10)).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreContractTest, ::testing::Values("hash", "file", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(OpenStoreTest, UrlsAreParsedOrRejectedClearly) {
  testing::TempDir dir;
  auto file = openStore("file://" + dir.path(), Deadline::afterMs(100));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->describe(), "file://" + dir.path());
  for (const char* bad :
       {"file://relative/dir", "redis://x:1", "tcp://nohost", "tcp://h:99999", "tcp://[::1:5"}) {
    auto s = openStore(bad, Deadline::afterMs(100));
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status();
  }
}

TEST(OpenStoreTest, UnreachableTcpStoreFailsAtTheDeadlineWithTheAddress) {
  // Bind and close a port so nothing listens there.
  uint16_t port;
  {
    auto server = TcpStoreServer::start({});
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }
  auto s = openStore("tcp://127.0.0.1:" + std::to_string(port), Deadline::afterMs(300));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos);
}

// Two FileStores on one directory in one process (or a crashed run's leftovers) must not
// collide on temporary file names: each used to count from 0 under the same pid.
TEST(FileStoreTest, TwoInstancesInOneProcessWriteSideBySide) {
  testing::TempDir dir;
  auto a = FileStore::open(dir.path());
  auto b = FileStore::open(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  // A leftover named as this process's next temporary file used to be.
  std::ofstream(dir.path() + "/.tmp." + std::to_string(::getpid()) + ".0") << "stale";
  ASSERT_TRUE((*a)->set("x", toBytes("from a")).ok());
  ASSERT_TRUE((*b)->set("y", toBytes("from b")).ok());
  EXPECT_EQ(toString((*b)->get("x", Deadline::afterMs(1000)).value()), "from a");
  EXPECT_EQ(toString((*a)->get("y", Deadline::afterMs(1000)).value()), "from b");
}

// Takes a FileStore directory's lock as another process would (its own open file description);
// the descriptor, -1 on failure. Closing it releases the lock.
int holdStoreLock(const std::string& dir) {
  const std::string lockPath = dir + "/.lock";
  const int fd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0 && ::flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A process holding the directory lock (stopped, stuck) makes add() and compareSet() fail at
// COFAB_STORE_TIMEOUT_MS naming the lock, instead of blocking forever.
TEST(FileStoreTest, AHeldLockIsADeadlineNotAHang) {
  testing::TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  const int holder = holdStoreLock(dir.path());  // another open file description: conflicts
  ASSERT_GE(holder, 0);
  ScopedParamOverride timeout("COFAB_STORE_TIMEOUT_MS", "100");
  auto added = (*store)->add("n", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), StatusCode::kDeadlineExceeded) << added.status();
  EXPECT_NE(added.status().message().find(".lock"), std::string::npos) << added.status();
  auto swapped = (*store)->compareSet("n", {}, toBytes("1"));
  EXPECT_EQ(swapped.status().code(), StatusCode::kDeadlineExceeded) << swapped.status();
  ::close(holder);  // released: the store works again
  EXPECT_EQ((*store)->add("n", 1).value(), 1);
}

// setBy() ends its wait for a held lock at the caller's deadline, not the store's timeout: a
// collective's failure report (1 s of grace) used to wait the whole COFAB_STORE_TIMEOUT_MS
// (60 s by default) behind a stopped store user, twice.
TEST(FileStoreTest, SetByWaitsForAHeldLockOnlyUntilItsDeadline) {
  testing::TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  const int holder = holdStoreLock(dir.path());
  ASSERT_GE(holder, 0);
  ScopedParamOverride timeout("COFAB_STORE_TIMEOUT_MS", "20000");
  Status st = (*store)->setBy("diag/0", toBytes("x"), Deadline::afterMs(50));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("at the caller's deadline"), std::string::npos) << st;
  ::close(holder);
  ASSERT_TRUE((*store)->setBy("diag/0", toBytes("x"), Deadline::afterMs(5000)).ok());
  EXPECT_EQ((*store)->get("diag/0", Deadline::afterMs(0)).value(), toBytes("x"));
}

// Only a missing key is "not there yet": a store directory that turned into something else (a
// file here; a failing network mount, a directory made unreadable) is an error at once. wait()
// used to run to its deadline blaming the keys, and check() said false.
TEST(FileStoreTest, AStoreDirectoryThatIsGoneIsAnErrorNotMissingKeys) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/store";
  auto store = FileStore::open(path);
  ASSERT_TRUE(store.ok());
  std::filesystem::remove_all(path);
  std::ofstream(path) << "not a directory";
  Status waited = (*store)->wait({"k"}, Deadline::afterMs(60000));
  EXPECT_EQ(waited.code(), StatusCode::kIoError) << waited;
  EXPECT_NE(waited.message().find(path), std::string::npos) << waited;
  auto checked = (*store)->check({"k"});
  EXPECT_EQ(checked.status().code(), StatusCode::kIoError) << checked.status();
  // Gone altogether (ENOENT for the key as for a key not yet written).
  std::filesystem::remove(path);
  Status gone = (*store)->wait({"k"}, Deadline::afterMs(60000));
  EXPECT_EQ(gone.code(), StatusCode::kIoError) << gone;
  EXPECT_EQ((*store)->check({"k"}).status().code(), StatusCode::kIoError);
  // get() too: it waited out its deadline and blamed the key.
  auto got = (*store)->get("k", Deadline::afterMs(20000));
  EXPECT_EQ(got.status().code(), StatusCode::kIoError) << got.status();
}

// set() and remove() take the directory lock like add() and compareSet(). Outside it, a set or
// remove landing between an add's read and its write was lost: written over by the add, or the
// key recreated. A held lock therefore bounds them at COFAB_STORE_TIMEOUT_MS too.
TEST(FileStoreTest, SetAndRemoveTakeTheLockThatAddTakes) {
  testing::TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->set("k", toBytes("v")).ok());
  const int holder = holdStoreLock(dir.path());  // as an add() in the middle of its read and write
  ASSERT_GE(holder, 0);
  {
    ScopedParamOverride timeout("COFAB_STORE_TIMEOUT_MS", "100");
    Status set = (*store)->set("k", toBytes("w"));
    EXPECT_EQ(set.code(), StatusCode::kDeadlineExceeded) << set;
    auto removed = (*store)->remove("k");
    EXPECT_EQ(removed.status().code(), StatusCode::kDeadlineExceeded) << removed.status();
  }
  auto kept = (*store)->get("k", Deadline::afterMs(1000));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(toString(*kept), "v");
  ::close(holder);
  ASSERT_TRUE((*store)->set("k", toBytes("w")).ok());
  EXPECT_EQ((*store)->remove("k").value(), true);
}

// The same race between two clients (as two processes): a set in the middle of a run of adds is
// never lost, so the adds that follow it count from it.
TEST(FileStoreTest, ASetIsNotLostAmongConcurrentAdds) {
  testing::TempDir dir;
  auto a = FileStore::open(dir.path());
  auto b = FileStore::open(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  std::atomic<int> added{0};
  std::thread adder([&] {
    for (int i = 0; i < 200; ++i) {
      if (!(*a)->add("n", 1).ok()) return;
      ++added;
    }
  });
  const Deadline started = Deadline::afterMs(20000);
  while (added.load() == 0 && !started.expired()) std::this_thread::yield();
  Status set = (*b)->set("n", toBytes("1000000"));
  adder.join();
  ASSERT_TRUE(set.ok()) << set;
  ASSERT_EQ(added.load(), 200);
  EXPECT_GE((*a)->add("n", 0).value(), 1000000) << "an add wrote over the set";
}

}  // namespace
}  // namespace cofab
