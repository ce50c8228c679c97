#include "fabric/rendezvous/bootstrap.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "core/log.h"
#include "core/param.h"
#include "fabric/rendezvous/tcp_socket.h"

namespace cofab {

COFAB_PARAM_INT(kRankParam, "COFAB_RANK", -1, -1, 1 << 24,
                "this process's rank (set by cofab-run)");
COFAB_PARAM_INT(kWorldParam, "COFAB_WORLD_SIZE", -1, -1, 1 << 24,
                "number of ranks in the job (set by cofab-run)");
COFAB_PARAM_INT(kLocalRankParam, "COFAB_LOCAL_RANK", -1, -1, 1 << 24,
                "rank among the processes of this host (set by cofab-run)");
COFAB_PARAM_STRING(kStoreParam, "COFAB_STORE", "",
                   "rendezvous store URL: tcp://host:port or file:///absolute/dir");

namespace {

struct Source {
  const char* name;
  const char* rank;
  const char* size;
  const char* localRank;
};

// In order of precedence. COFAB_* come first: cofab-run may itself run under a launcher.
constexpr Source kSources[] = {
    {"cofab", "COFAB_RANK", "COFAB_WORLD_SIZE", "COFAB_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

StatusOr<int> parseInt(const std::string& name, const std::string& value) {
  auto v = parseIntIn(value, name, 0, 1 << 24);  // whole decimal: no ' 3' or '+3'
  if (!v.ok()) return InvalidArgument(name + "='" + value + "' is not a non-negative integer");
  return static_cast<int>(*v);
}

}  // namespace

std::vector<std::string> otherLaunchersRankVariables() {
  std::vector<std::string> names;
  for (const auto& src : kSources) {
    if (std::string_view(src.name) == "cofab") continue;
    names.insert(names.end(), {src.rank, src.size, src.localRank});
  }
  return names;
}

EnvLookup processEnv() {
  return [](std::string_view name, std::string* value) { return rawParamValue(name, value); };
}

StatusOr<BootstrapInfo> readBootstrapEnv(const EnvLookup& env) {
  std::string seen;  // every variable we looked at and found, for error messages
  auto lookup = [&](const char* name, std::string* v) {
    if (!env(name, v)) return false;
    seen += std::string(seen.empty() ? "" : ", ") + name + "=" + *v;
    return true;
  };
  auto fail = [&](const std::string& what) {
    return InvalidArgument("bootstrap: " + what + " (seen: " + (seen.empty() ? "nothing" : seen) +
                           "). Launch with cofab-run, torchrun, mpirun or srun, or set "
                           "COFAB_RANK, COFAB_WORLD_SIZE and COFAB_STORE.");
  };

  std::optional<BootstrapInfo> chosen;
  for (const auto& src : kSources) {
    std::string r, s, l;
    // Slurm's variables describe an allocation as well as a step. salloc sets SLURM_NTASKS
    // alone: an allocation without a step, not this rank's place. And a batch script's shell
    // passes its SLURM_PROCID=0 to every rank that mpirun or torchrun starts from it: next to
    // such a launcher's variables, Slurm's rank 0 is the batch step, not a contradiction. Any
    // other Slurm rank is an srun task, checked below (stale RANK=0 exported in the script
    // before `srun -n 8` is still refused on tasks 1..7, as are leftover COFAB_*).
    if (std::string_view(src.name) == "Slurm") {
      std::string procid;
      if (!env(src.rank, &procid)) continue;
      if (chosen && chosen->source != "cofab" && procid == "0") continue;
    }
    bool hasRank = lookup(src.rank, &r);
    bool hasSize = lookup(src.size, &s);
    bool hasLocal = lookup(src.localRank, &l);
    if (!hasRank && !hasSize) continue;
    if (hasRank != hasSize) {
      return fail(std::string(src.name) + " sets only one of " + src.rank + " and " + src.size);
    }
    BootstrapInfo info;
    info.source = src.name;
    COFAB_ASSIGN_OR_RETURN(info.rank, parseInt(src.rank, r));
    COFAB_ASSIGN_OR_RETURN(info.worldSize, parseInt(src.size, s));
    if (hasLocal) {
      COFAB_ASSIGN_OR_RETURN(info.localRank, parseInt(src.localRank, l));
    } else {
      info.localRank = info.rank;
    }
    if (!chosen) {
      chosen = info;
    } else if (chosen->worldSize != info.worldSize &&
               chosen->worldSize % info.worldSize == 0 && chosen->worldSize > info.worldSize) {
      // A larger world made of the other's tasks: an outer launcher this one runs inside (srun's
      // 2 tasks around torchrun's 8 workers), not this job's world. A smaller or unrelated world
      // (COFAB_WORLD_SIZE=1 left in the shell under srun -n 8) still contradicts.
      continue;
    } else if (chosen->rank != info.rank || chosen->worldSize != info.worldSize) {
      return fail(chosen->source + " says rank " + std::to_string(chosen->rank) + " of " +
                  std::to_string(chosen->worldSize) + " but " + src.name + " says rank " +
                  std::to_string(info.rank) + " of " + std::to_string(info.worldSize));
    }
  }
  if (!chosen) return fail("no rank and world size in the environment");
  if (chosen->worldSize < 1) return fail("world size must be at least 1");
  if (chosen->rank >= chosen->worldSize) {
    return fail("rank " + std::to_string(chosen->rank) + " is outside a world of " +
                std::to_string(chosen->worldSize));
  }
  if (chosen->localRank >= chosen->worldSize) {
    return fail("local rank " + std::to_string(chosen->localRank) + " is outside the world");
  }

  std::string store, addr, port;
  if (lookup("COFAB_STORE", &store)) {
    if (store.empty()) return fail("COFAB_STORE is empty");
    chosen->storeUrl = store;
  } else if (lookup("MASTER_ADDR", &addr) && lookup("MASTER_PORT", &port)) {
    // torchrun's rendezvous address; cofab runs its own store protocol there, so rank 0 hosts
    // a TcpStore server on MASTER_PORT+1 (bootstrapFromEnv), never on torch's own port. Under
    // any other launcher nobody hosts one there.
    if (chosen->source != "torchrun") {
      return fail(
          "no store: MASTER_ADDR/MASTER_PORT name a store only under torchrun (its rank 0 "
          "hosts it next to torch's port); under " +
          chosen->source + " set COFAB_STORE=tcp://host:port (cofab-store) or file:///dir");
    }
    COFAB_ASSIGN_OR_RETURN(int p, parseInt("MASTER_PORT", port));
    // Port 0 is no rendezvous port (the store would go to port 1).
    if (p < 1 || p + 1 > 65535) return fail("MASTER_PORT must be in 1..65534, got " + port);
    chosen->storeUrl = "tcp://" + addr + ":" + std::to_string(p + 1);
  } else {
    return fail("no store: set COFAB_STORE=tcp://host:port or file:///dir");
  }
  return *chosen;
}

std::string defaultJoinToken() {
  // host:pid alone is not unique: containers sharing the host's network (and so its name) each
  // run their trainer as pid 1, and a restarted container reuses its pids. A random part,
  // drawn once per process (again after a fork), tells them apart; the same process joining
  // again keeps its token, so a re-join stays idempotent.
  static std::mutex mu;
  static pid_t drawnIn = 0;
  static std::string token;
  std::lock_guard<std::mutex> lock(mu);
  if (drawnIn != ::getpid()) {
    drawnIn = ::getpid();
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    uint64_t nonce = 0;
    try {
      std::random_device random;
      nonce = (uint64_t{random()} << 32) | random();
    } catch (...) {
      // No entropy source (a sandbox without getrandom or /dev/urandom): the clock still
      // tells two processes apart in all but the most unlucky case.
      nonce = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
              (static_cast<uint64_t>(drawnIn) << 40);
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(nonce));
    token = std::string(host) + ":" + std::to_string(drawnIn) + ":" + hex;
  }
  return token;
}

Status joinStore(Store& store, const BootstrapInfo& info, const JoinOptions& options) {
  if (info.rank < 0 || info.worldSize < 1 || info.rank >= info.worldSize) {
    return InvalidArgument("joinStore: rank " + std::to_string(info.rank) + " of world " +
                           std::to_string(info.worldSize) + " is invalid");
  }
  const std::string token = options.token.empty() ? defaultJoinToken() : options.token;
  const std::string prefix = options.jobPrefix + "/bootstrap/";
  Bytes size = toBytes(std::to_string(info.worldSize));
  COFAB_ASSIGN_OR_RETURN(Bytes agreed, store.compareSet(prefix + "world_size", {}, size));
  if (agreed != size) {
    return InvalidArgument("world size mismatch: this process (rank " + std::to_string(info.rank) +
                           ") says " + std::to_string(info.worldSize) + ", but the store " +
                           store.describe() + " already holds " + toString(agreed) +
                           " from another rank");
  }
  Bytes mine = toBytes(token);
  std::string rankKey = prefix + "rank/" + std::to_string(info.rank);
  COFAB_ASSIGN_OR_RETURN(Bytes owner, store.compareSet(rankKey, {}, mine));
  if (owner != mine) {
    return FailedPrecondition("rank " + std::to_string(info.rank) + " is already claimed by '" +
                              toString(owner) + "' (this process is '" + token +
                              "'): two processes claim the same rank, a rank joined twice, or the store "
                              "still holds an earlier job's claims (use a fresh store per job)");
  }
  return OkStatus();
}

StatusOr<BootstrapResult> bootstrapFromEnv(Deadline connectDeadline) {
  BootstrapResult out;
  COFAB_ASSIGN_OR_RETURN(out.info, readBootstrapEnv());
  setLogRank(out.info.rank);
  std::string ignored;
  if (out.info.rank == 0 && out.info.source == "torchrun" &&
      !rawParamValue("COFAB_STORE", &ignored)) {
    // Under torchrun nobody else hosts a cofab store: rank 0 does, next to torch's port.
    COFAB_ASSIGN_OR_RETURN(HostPort addr, parseHostPort(out.info.storeUrl.substr(6)));
    TcpStoreServerOptions options;
    options.bindAddress = "0.0.0.0";
    options.port = addr.port;
    COFAB_ASSIGN_OR_RETURN(out.server, TcpStoreServer::start(options));
  }
  COFAB_ASSIGN_OR_RETURN(out.store, openStore(out.info.storeUrl, connectDeadline));
  COFAB_RETURN_IF_ERROR(joinStore(*out.store, out.info));
  return out;
}

}  // namespace cofab
