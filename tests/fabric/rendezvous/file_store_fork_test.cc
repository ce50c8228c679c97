// FileStore's lock and fork(): a process forked while this one holds the store's lock (another
// thread's set(), say, while the training binary starts a data-loader process) keeps a copy of
// the lock's descriptor. The lock went with the descriptor's close, which the child's copy
// outlives, so every store user timed out on it for as long as the child lived. Own binary:
// it replaces rename(2), through which FileStore publishes a key while it holds the lock, to
// fork exactly there.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "fabric/rendezvous/file_store.h"
#include "tests/support/temp_dir.h"

namespace {
std::atomic<bool> gForkOnRename{false};
pid_t gChild = -1;
int gChildPipe[2] = {-1, -1};
}  // namespace

// Only this test binary's calls come here; with the hook off it is the real rename.
extern "C" int rename(const char* from, const char* to) {
  using Fn = int (*)(const char*, const char*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "rename"));
  if (gForkOnRename.exchange(false)) {
    gChild = ::fork();
    if (gChild == 0) {         // holds every descriptor the parent had, the lock's too, until told
      ::close(gChildPipe[1]);  // so that the parent's close is an end of file here
      char c;
      while (::read(gChildPipe[0], &c, 1) < 0) {
      }
      ::_exit(0);
    }
  }
  return real(from, to);
}

namespace cofab::testing {
namespace {

TEST(FileStoreFork, AChildForkedWhileTheLockIsHeldDoesNotKeepIt) {
  TempDir dir;
  auto store = FileStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ(::pipe(gChildPipe), 0);
  gForkOnRename = true;
  ASSERT_TRUE((*store)->set("first", Bytes{1}).ok());
  ASSERT_GT(gChild, 0) << "set() did not publish through rename(): the test lost its fork point";
  // The child lives on, holding its copy of the lock's descriptor.
  const Status second = (*store)->setBy("second", Bytes{2}, Deadline::afterMs(5000));
  ::close(gChildPipe[1]);
  int status = 0;
  EXPECT_EQ(::waitpid(gChild, &status, 0), gChild);
  ::close(gChildPipe[0]);
  EXPECT_TRUE(second.ok()) << second;
}

}  // namespace
}  // namespace cofab::testing
