// Bootstrap: who am I in this job, and where do we meet?
//
// Reads rank, world size, local rank and the store URL from the launcher's environment:
// cofab's own COFAB_RANK / COFAB_WORLD_SIZE / COFAB_LOCAL_RANK / COFAB_STORE (set by cofab-run),
// torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, Open MPI's
// OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK and Slurm's SLURM_PROCID / SLURM_NTASKS /
// SLURM_LOCALID. Sources that disagree, missing or malformed values are InvalidArgument with
// a message listing every variable seen. Then join() claims the rank in the store, so that two
// processes claiming one rank, a rank joining twice, or ranks disagreeing on the world size are
// reported instead of hanging later.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric/rendezvous/store.h"
#include "fabric/rendezvous/tcp_store_server.h"

namespace cofab {

struct BootstrapInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string storeUrl;  // "tcp://host:port" or "file:///dir"
  std::string source;    // which launcher's variables were used: "cofab", "torchrun", ...
};

// Looks up one environment variable; returns false when unset. The default reads overrides
// (ScopedParamOverride) and then the process environment.
using EnvLookup = std::function<bool(std::string_view name, std::string* value)>;
EnvLookup processEnv();
// The rank, world-size and local-rank variables of the other launchers readBootstrapEnv reads
// (torchrun, Open MPI, Slurm). cofab-run removes them from its children's environment: run
// inside an allocation, they describe cofab-run's own place there, not its ranks'.
std::vector<std::string> otherLaunchersRankVariables();

StatusOr<BootstrapInfo> readBootstrapEnv(const EnvLookup& env = processEnv());

struct JoinOptions {
  // Identifies this process in "rank already claimed by ..." errors. Default:
  // defaultJoinToken().
  std::string token;
  // Namespace for the bootstrap keys, so several jobs can share one store server.
  std::string jobPrefix = "cofab";
};

// host:pid:<random>, the random part drawn once per process: unique across containers that
// share a host name and pid numbers.
std::string defaultJoinToken();

// Records the world size (all ranks must agree) and claims `info.rank` exactly once.
Status joinStore(Store& store, const BootstrapInfo& info, const JoinOptions& options = {});

// readBootstrapEnv + openStore + joinStore; also sets the log rank prefix.
struct BootstrapResult {
  BootstrapInfo info;
  std::unique_ptr<Store> store;
  // Set on torchrun's rank 0 without COFAB_STORE: the store server it hosts on MASTER_PORT+1.
  // Keep the result alive for the job's duration.
  std::unique_ptr<TcpStoreServer> server;
};
StatusOr<BootstrapResult> bootstrapFromEnv(Deadline connectDeadline);

}  // namespace cofab
