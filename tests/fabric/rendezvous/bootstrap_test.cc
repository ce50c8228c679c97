#include "fabric/rendezvous/bootstrap.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <map>

#include "fabric/rendezvous/file_store.h"
#include "fabric/rendezvous/hash_store.h"
#include "tests/support/thread_ranks.h"

namespace cofab {
namespace {

EnvLookup fakeEnv(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name, std::string* v) {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return false;
    *v = it->second;
    return true;
  };
}

TEST(BootstrapEnvTest, ReadsEachLaunchersVariables) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string source;
    int rank, size, local;
    std::string store;
  };
  const Case cases[] = {
      {{{"COFAB_RANK", "2"}, {"COFAB_WORLD_SIZE", "4"}, {"COFAB_LOCAL_RANK", "0"},
        {"COFAB_STORE", "tcp://h:1"}},
       "cofab", 2, 4, 0, "tcp://h:1"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.1.1.1"},
        {"MASTER_PORT", "29500"}},
       "torchrun", 1, 8, 1, "tcp://10.1.1.1:29501"},
      {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"COFAB_STORE", "file:///tmp/x"}},
       "Open MPI", 3, 4, 1, "file:///tmp/x"},
      {{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "2"},
        {"COFAB_STORE", "tcp://n1:7"}},
       "Slurm", 5, 6, 2, "tcp://n1:7"},
  };
  for (const auto& c : cases) {
    auto info = readBootstrapEnv(fakeEnv(c.env));
    ASSERT_TRUE(info.ok()) << c.source << ": " << info.status();
    EXPECT_EQ(info->source, c.source);
    EXPECT_EQ(info->rank, c.rank);
    EXPECT_EQ(info->worldSize, c.size);
    EXPECT_EQ(info->localRank, c.local);
    EXPECT_EQ(info->storeUrl, c.store);
  }
}

TEST(BootstrapEnvTest, AgreeingLaunchersAreFineContradictingOnesAreNamed) {
  auto ok = readBootstrapEnv(fakeEnv({{"COFAB_RANK", "1"}, {"COFAB_WORLD_SIZE", "2"},
                                      {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                                      {"COFAB_STORE", "tcp://a:1"}}));
  EXPECT_TRUE(ok.ok()) << ok.status();
  auto bad = readBootstrapEnv(fakeEnv({{"COFAB_RANK", "1"}, {"COFAB_WORLD_SIZE", "2"},
                                       {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                       {"COFAB_STORE", "tcp://a:1"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = bad.status().message();
  EXPECT_NE(m.find("cofab says rank 1 of 2 but Slurm says rank 0 of 2"), std::string::npos) << m;
  EXPECT_NE(m.find("SLURM_PROCID=0"), std::string::npos) << m;
}

// A launcher inside another's step (srun ... torchrun --nproc-per-node 4): each worker sees
// torchrun's RANK=5 WORLD_SIZE=8 and the outer srun's SLURM_PROCID=1 SLURM_NTASKS=2. A source of
// lower precedence with another world size describes the outer launch, not a contradiction; it
// was refused ("torchrun says rank 5 of 8 but Slurm says rank 1 of 2").
TEST(BootstrapEnvTest, AnOuterLauncherWithAnotherWorldSizeIsNotAContradiction) {
  auto nested = readBootstrapEnv(fakeEnv({{"RANK", "5"}, {"WORLD_SIZE", "8"},
                                          {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "1"},
                                          {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "h"},
                                          {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->rank, 5);
  EXPECT_EQ(nested->worldSize, 8);
  EXPECT_EQ(nested->source, "torchrun");
  // A stale smaller world left in the shell is no outer launcher: still refused.
  auto stale = readBootstrapEnv(fakeEnv({{"COFAB_RANK", "0"}, {"COFAB_WORLD_SIZE", "1"},
                                         {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"},
                                         {"COFAB_STORE", "tcp://a:1"}}));
  EXPECT_EQ(stale.status().code(), StatusCode::kInvalidArgument) << stale.status();
}

// Slurm's variables where no srun step launched the process: a batch script's shell carries
// SLURM_PROCID=0 and SLURM_NTASKS=n into every rank that mpirun or torchrun starts from it, and
// salloc sets SLURM_NTASKS alone. Neither is this rank's place: they were refused ("Open MPI
// says rank 3 of 8 but Slurm says rank 0 of 8"; "Slurm sets only one of ...").
TEST(BootstrapEnvTest, AnAllocationsSlurmVariablesDoNotOverruleTheLauncher) {
  auto mpirunInSbatch = readBootstrapEnv(fakeEnv(
      {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}, {"COFAB_STORE", "tcp://a:1"}}));
  ASSERT_TRUE(mpirunInSbatch.ok()) << mpirunInSbatch.status();
  EXPECT_EQ(mpirunInSbatch->source, "Open MPI");
  EXPECT_EQ(mpirunInSbatch->rank, 3);
  auto torchrunInSbatch = readBootstrapEnv(
      fakeEnv({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "3"}, {"MASTER_ADDR", "h"},
               {"MASTER_PORT", "29500"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}));
  ASSERT_TRUE(torchrunInSbatch.ok()) << torchrunInSbatch.status();
  EXPECT_EQ(torchrunInSbatch->rank, 3);
  auto byHandInSalloc = readBootstrapEnv(fakeEnv({{"COFAB_RANK", "1"}, {"COFAB_WORLD_SIZE", "4"},
                                                  {"COFAB_STORE", "tcp://a:1"},
                                                  {"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(byHandInSalloc.ok()) << byHandInSalloc.status();
  EXPECT_EQ(byHandInSalloc->rank, 1);
  // An srun task (Slurm rank 3) with a stale RANK=0 exported in the script: still refused.
  auto staleUnderSrun = readBootstrapEnv(
      fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
               {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}}));
  EXPECT_EQ(staleUnderSrun.status().code(), StatusCode::kInvalidArgument)
      << staleUnderSrun.status();
}

// MASTER_ADDR/MASTER_PORT name a store only under torchrun, whose rank 0 hosts it next to
// torch's port. Exported in a Slurm script and launched with srun, they used to become a store
// address nobody served: every rank waited out its connect deadline on "Connection refused".
TEST(BootstrapEnvTest, MasterAddrOutsideTorchrunIsNoStore) {
  auto srun = readBootstrapEnv(fakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                        {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}));
  ASSERT_FALSE(srun.ok());
  EXPECT_EQ(srun.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(srun.status().message().find("only under torchrun"), std::string::npos)
      << srun.status();
  EXPECT_NE(srun.status().message().find("COFAB_STORE"), std::string::npos) << srun.status();
}

TEST(BootstrapEnvTest, MissingAndMalformedValuesListWhatWasSeen) {
  struct Case {
    std::map<std::string, std::string> env;
    std::string expect;
  };
  const Case cases[] = {
      {{}, "no rank and world size"},
      {{{"COFAB_RANK", "0"}, {"COFAB_STORE", "tcp://a:1"}}, "sets only one of"},
      {{{"COFAB_RANK", "x"}, {"COFAB_WORLD_SIZE", "2"}}, "COFAB_RANK='x'"},
      {{{"COFAB_RANK", "-1"}, {"COFAB_WORLD_SIZE", "2"}}, "COFAB_RANK='-1'"},
      // Whole decimal numbers only (strtol took leading whitespace and a '+').
      {{{"COFAB_RANK", " 1"}, {"COFAB_WORLD_SIZE", "2"}}, "COFAB_RANK=' 1'"},
      {{{"COFAB_RANK", "0"}, {"COFAB_WORLD_SIZE", "+2"}}, "COFAB_WORLD_SIZE='+2'"},
      // torchrun's port 0 put the store on port 1.
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "0"}},
       "MASTER_PORT must be in 1..65534"},
      {{{"COFAB_RANK", "2"}, {"COFAB_WORLD_SIZE", "2"}, {"COFAB_STORE", "tcp://a:1"}},
       "rank 2 is outside a world of 2"},
      {{{"COFAB_RANK", "0"}, {"COFAB_WORLD_SIZE", "0"}, {"COFAB_STORE", "tcp://a:1"}},
       "at least 1"},
      {{{"COFAB_RANK", "0"}, {"COFAB_WORLD_SIZE", "2"}}, "no store"},
      {{{"COFAB_RANK", "0"}, {"COFAB_WORLD_SIZE", "2"}, {"COFAB_STORE", ""}},
       "COFAB_STORE is empty"},
  };
  for (const auto& c : cases) {
    auto info = readBootstrapEnv(fakeEnv(c.env));
    ASSERT_FALSE(info.ok()) << c.expect;
    EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(info.status().message().find(c.expect), std::string::npos) << info.status();
  }
}

TEST(JoinStoreTest, EveryRankJoinsOnce) {
  HashStore store;
  auto statuses = testing::runThreadRanks(8, [&](int rank) {
    BootstrapInfo info{rank, 8, rank, "hash://", "test"};
    return joinStore(store, info, {"thread-" + std::to_string(rank)});
  });
  EXPECT_TRUE(testing::allOk(statuses).ok()) << testing::allOk(statuses);
}

TEST(JoinStoreTest, TwoProcessesClaimingOneRankAreTold) {
  HashStore store;
  BootstrapInfo info{1, 4, 1, "hash://", "test"};
  ASSERT_TRUE(joinStore(store, info, {"first"}).ok());
  Status again = joinStore(store, info, {"second"});
  ASSERT_EQ(again.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("rank 1 is already claimed by 'first'"), std::string::npos) << again;
  // The same process (same token) re-joining is idempotent; a restarted one (new pid, so a new
  // token) is the "second" case above.
  EXPECT_TRUE(joinStore(store, info, {"first"}).ok());
}

// Containers that share the host's network (and so its name) each run their trainer as pid 1:
// with the default token host:pid, a second process claiming rank 0 looked like the first one
// re-joining, and both claims passed. Here two forked processes, each pid 1 of a PID namespace
// of its own, claim rank 0 of one file store with default tokens.
TEST(JoinStoreTest, DefaultTokensOfProcessesWithTheSameHostAndPidDiffer) {
  const std::string dir = ::testing::TempDir() + "cofab-join-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  enum : int { kClaimed = 0, kRefused = 1, kOther = 2, kNoNamespace = 77 };
  auto claimAsPidOne = [&]() -> int {
    const pid_t outer = ::fork();
    if (outer < 0) return kOther;
    if (outer == 0) {
      if (::unshare(CLONE_NEWPID) != 0) ::_exit(kNoNamespace);
      const pid_t inner = ::fork();  // pid 1 of the new namespace
      if (inner == 0) {
        if (::getpid() != 1) ::_exit(kOther);
        auto store = FileStore::open(dir);
        if (!store.ok()) ::_exit(kOther);
        Status s = joinStore(**store, BootstrapInfo{0, 2, 0, "file://", "test"});
        ::_exit(s.ok()                                        ? kClaimed
                : s.code() == StatusCode::kFailedPrecondition ? kRefused
                                                              : kOther);
      }
      int status = 0;
      if (inner < 0 || ::waitpid(inner, &status, 0) != inner || !WIFEXITED(status)) {
        ::_exit(kOther);
      }
      ::_exit(WEXITSTATUS(status));
    }
    int status = 0;
    if (::waitpid(outer, &status, 0) != outer || !WIFEXITED(status)) return kOther;
    return WEXITSTATUS(status);
  };
  const int first = claimAsPidOne();
  if (first == kNoNamespace) {
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << "cannot create a PID namespace (needs root)";
  }
  const int second = claimAsPidOne();
  std::filesystem::remove_all(dir);
  EXPECT_EQ(first, kClaimed);
  EXPECT_EQ(second, kRefused) << "a second pid 1 on this host claimed rank 0 too";
}

TEST(JoinStoreTest, WorldSizeMismatchIsInvalidArgument) {
  HashStore store;
  ASSERT_TRUE(joinStore(store, BootstrapInfo{0, 4, 0, "", ""}, {"a"}).ok());
  Status s = joinStore(store, BootstrapInfo{1, 3, 1, "", ""}, {"b"});
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("says 3"), std::string::npos) << s;
  EXPECT_NE(s.message().find("already holds 4"), std::string::npos) << s;
  EXPECT_EQ(joinStore(store, BootstrapInfo{4, 4, 0, "", ""}, {"c"}).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cofab
