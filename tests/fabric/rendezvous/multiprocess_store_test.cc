// Stores shared by forked processes: exact totals from concurrent adds, and rank claims.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "fabric/rendezvous/file_store.h"
#include "fabric/rendezvous/tcp_store.h"
#include "fabric/rendezvous/tcp_store_server.h"
#include "tests/support/process_group.h"
#include "tests/support/temp_dir.h"

namespace cofab {
namespace {

constexpr int kProcs = 6;
constexpr int kAddsEach = 40;

int addMany(Store& store, int rank) {
  for (int i = 0; i < kAddsEach; ++i) {
    auto r = store.add("total", rank + 1);
    if (!r.ok()) return testing::childFail(rank, r.status().toString());
  }
  if (!store.set("done/" + std::to_string(rank), {}).ok()) return 2;
  return 0;
}

int64_t expectedTotal() {
  int64_t sum = 0;
  for (int r = 0; r < kProcs; ++r) sum += static_cast<int64_t>(r + 1) * kAddsEach;
  return sum;
}

TEST(MultiProcessStoreTest, FileStoreAddsFromManyProcessesAreExact) {
  testing::TempDir dir;
  testing::ProcessGroup procs;
  procs.start(kProcs, [&](int rank) {
    auto store = FileStore::open(dir.path());
    if (!store.ok()) return testing::childFail(rank, store.status().toString());
    return addMany(**store, rank);
  });
  auto exits = procs.waitAll(Deadline::afterMs(60'000));
  ASSERT_EQ(testing::failures(exits), "");
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*(*store)->add("total", 0), expectedTotal());
}

TEST(MultiProcessStoreTest, TcpStoreAddsFromManyProcessesAreExact) {
  // The server runs in its own process too, so the test process forks before any thread.
  testing::ProcessGroup server;
  int portPipe[2];
  ASSERT_EQ(::pipe(portPipe), 0);
  server.spawn([&] {
    auto s = TcpStoreServer::start({});
    if (!s.ok()) return 1;
    uint16_t port = (*s)->port();
    (void)!::write(portPipe[1], &port, sizeof(port));
    ::pause();  // until killed
    return 0;
  });
  uint16_t port = 0;
  ASSERT_EQ(::read(portPipe[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  testing::ProcessGroup procs;
  procs.start(kProcs, [&](int rank) {
    auto store = TcpStore::connect("127.0.0.1", port, {}, Deadline::afterMs(5000));
    if (!store.ok()) return testing::childFail(rank, store.status().toString());
    return addMany(**store, rank);
  });
  auto exits = procs.waitAll(Deadline::afterMs(60'000));
  ASSERT_EQ(testing::failures(exits), "");
  auto store = TcpStore::connect("127.0.0.1", port, {}, Deadline::afterMs(5000));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*(*store)->add("total", 0), expectedTotal());
  server.signal(0, SIGKILL);
  server.waitAll(Deadline::afterMs(5000));
}

}  // namespace
}  // namespace cofab
