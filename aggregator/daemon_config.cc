#include "aggregator/daemon_config.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/param.h"

namespace cofab::aggregator {

COFAB_PARAM_STRING(kAggTransport, "COFAB_AGG_TRANSPORT", "tcp", "cofab-aggd transport backend");
COFAB_PARAM_STRING(kAggListen, "COFAB_AGG_LISTEN", "",
                   "cofab-aggd listen address (empty: transport default, any port)");
COFAB_PARAM_INT(kAggEngines, "COFAB_AGG_ENGINES", 2, 1, 256, "cofab-aggd engine (shard) threads");
COFAB_PARAM_BOOL(kAggReplication, "COFAB_AGG_REPLICATION", false,
                 "cofab-aggd forwards every contribution to its backup before acking");
COFAB_PARAM_INT(kAggRoundTimeoutMs, "COFAB_AGG_ROUND_TIMEOUT_MS", 120000, 1, 86400000,
                "cofab-aggd releases a round still missing live workers after this long");
COFAB_PARAM_INT(kAggDeadWorkerMs, "COFAB_AGG_DEAD_WORKER_MS", 2000, 0, 86400000,
                "cofab-aggd releases a round missing a disconnected worker after this long");
COFAB_PARAM_INT(kAggBackupAckTimeoutMs, "COFAB_AGG_BACKUP_ACK_TIMEOUT_MS", 5000, 1, 86400000,
                "cofab-aggd with replication: a forward unacknowledged this long ends replication");
COFAB_PARAM_INT(kAggMaxChunk, "COFAB_AGG_MAX_CHUNK_BYTES", 64 << 20, 64, 1 << 30,
                "cofab-aggd rejects larger chunks");
COFAB_PARAM_INT(kAggDrainMs, "COFAB_AGG_DRAIN_TIMEOUT_MS", 5000, 0, 3600000,
                "cofab-aggd waits this long for open rounds on SIGTERM");
COFAB_PARAM_INT(kAggStaleness, "COFAB_AGG_STALENESS", 3, 0, 1 << 30,
                "cofab-aggd model store: SSP staleness bound in worker clocks");
COFAB_PARAM_INT(kAggVersionStaleness, "COFAB_AGG_VERSION_STALENESS", 16, 0, 1 << 30,
                "cofab-aggd model store: staleness bound of apply-and-pull in model versions");
COFAB_PARAM_INT(kAggCreditBytes, "COFAB_AGG_CREDIT_BYTES", 0, 0, int64_t{1} << 40,
                "cofab-aggd grants each worker this many bytes of unconsumed pushes (0: off)");
COFAB_PARAM_STRING(kAggHttp, "COFAB_AGG_HTTP", "127.0.0.1:0",
                   "cofab-aggd health/metrics endpoint host:port, or off");
COFAB_PARAM_STRING(kAggPrefix, "COFAB_AGG_STORE_PREFIX", "cofab/agg",
                   "store namespace cofab-aggd registers under");
COFAB_PARAM_STRING(kAggConfig, "COFAB_AGG_CONFIG", "", "cofab-aggd key=value config file");
COFAB_PARAM_INT(kRoleRank, "COFAB_ROLE_RANK", 0, 0, 1 << 20,
                "index of this process within its cofab-run --role (set by cofab-run)");
COFAB_PARAM_INT(kRoleSize, "COFAB_ROLE_SIZE", 1, 1, 1 << 20,
                "processes in this cofab-run --role (set by cofab-run)");

std::string daemonUsage() {
  return "usage: cofab-aggd [flags]   (every flag also works as 'name = value' in --config)\n"
         "  --workers N            workers per round (default COFAB_WORLD_SIZE)\n"
         "  --id I --servers M     this daemon's index among M (default COFAB_ROLE_RANK/SIZE)\n"
         "  --store URL            register in this store (default COFAB_STORE)\n"
         "  --store-prefix P       store namespace (COFAB_AGG_STORE_PREFIX, cofab/agg)\n"
         "  --peers A0,A1,...      static deployment: every daemon's address, no store\n"
         "  --transport NAME       tcp, dpdk or rdma (COFAB_AGG_TRANSPORT, tcp)\n"
         "  --listen ADDR          listen address (COFAB_AGG_LISTEN)\n"
         "  --engines K            engine threads (COFAB_AGG_ENGINES, 2)\n"
         "  --replication on|off   forward to the backup (id+1)%M before acking\n"
         "  --first-iteration T    iteration every chunk's first round has (0)\n"
         "  --round-timeout-ms X   release rounds missing live workers (120000)\n"
         "  --dead-worker-ms X     release rounds missing a lost worker (2000)\n"
         "  --backup-ack-timeout-ms X  replication ends when a forward waits this long for\n"
         "                         the backup's ack (a silent backup; 5000)\n"
         "  --gradient-stragglers S  gradient coding: a round completes once every group of\n"
         "                         S+1 consecutive workers has one contribution (off)\n"
         "  --max-chunk-bytes B    reject bigger chunks (64 MiB)\n"
         "  --drain-timeout-ms X   on SIGTERM, wait this long for open rounds (5000)\n"
         "  --connect-timeout-ms X store and backup connection deadline (60000)\n"
         "  --staleness TAU        model store SSP bound in clocks (COFAB_AGG_STALENESS, 3)\n"
         "  --version-staleness V  model store bound in versions for apply-and-pull: older\n"
         "                         updates are dropped (COFAB_AGG_VERSION_STALENESS, 16)\n"
         "  --credit-bytes B       credit window per worker, 0 = off (COFAB_AGG_CREDIT_BYTES)\n"
         "  --http HOST:PORT|off   /healthz and /metrics (COFAB_AGG_HTTP, 127.0.0.1:0)\n"
         "  --config FILE          key = value lines, '#' comments (COFAB_AGG_CONFIG)\n";
}

namespace {

// "off", or HOST:PORT with a decimal port (0: any free one).
Status checkHttpAddress(const std::string& v) {
  if (v == "off") return OkStatus();
  const auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgument("--http expects HOST:PORT or off, got '" + v + "'");
  }
  return parseIntIn(v.substr(colon + 1), "--http's port", 0, 65535).status();
}

// The same words as the COFAB_* switches (core/param.h), so a flag and its variable agree.
StatusOr<bool> parseBool(const std::string& name, const std::string& v) {
  if (const auto b = parseBoolText(v)) return *b;
  return InvalidArgument("--" + name + " expects on|off (or 1/0, true/false, yes/no), got '" + v +
                         "'");
}

Status readConfigFile(const std::string& path, std::map<std::string, std::string>* out) {
  // A directory opens as an empty stream: it would read as a file with nothing in it.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return IoError("config file '" + path + "' is not a readable regular file");
  }
  std::ifstream in(path);
  if (!in) return IoError("cannot read config file '" + path + "'");
  std::map<std::string, int> lineOf;  // where each name was set
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto eq = line.find('=');
    auto trim = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r");
      const auto e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    if (trim(line).empty()) continue;
    if (eq == std::string::npos) {
      return InvalidArgument(path + ":" + std::to_string(n) + ": expected 'name = value'");
    }
    const std::string name = trim(line.substr(0, eq));
    if (auto [it, fresh] = lineOf.emplace(name, n); !fresh) {
      // Which of the two was meant is a guess the daemon should not make.
      return InvalidArgument(path + ":" + std::to_string(n) + ": '" + name +
                             "' is set again (first at line " + std::to_string(it->second) + ")");
    }
    (*out)[name] = trim(line.substr(eq + 1));
  }
  if (in.bad()) return IoError("error reading config file '" + path + "'");
  return OkStatus();
}

// Flags and config lines share the environment variables' ranges; the ones without a variable
// of their own get theirs here. A value that does not fit would otherwise be narrowed silently
// (--workers 4294967297 became 1, --max-chunk-bytes -1 became SIZE_MAX).
struct Range {
  int64_t min, max;
};
constexpr Range kWorkersRange{1, 65536};
constexpr Range kIdRange{0, 65535};
constexpr Range kServersRange{1, ps::kMaxDaemons};  // what clients' discovery accepts
constexpr Range kFirstIterationRange{0, int64_t{1} << 62};
constexpr Range kStragglersRange{0, 65535};
constexpr Range kConnectTimeoutRange{1, 86400000};

Status apply(DaemonConfig& c, const std::string& name, const std::string& v) {
  ServerOptions& s = c.server;
  const std::string flag = "--" + name;
  auto intIn = [&](const auto& range, auto& field) -> Status {
    int64_t x = 0;
    if constexpr (std::is_same_v<std::decay_t<decltype(range)>, Range>) {
      COFAB_ASSIGN_OR_RETURN(x, parseIntIn(v, flag, range.min, range.max));
    } else {
      COFAB_ASSIGN_OR_RETURN(x, range.parse(v, flag));
    }
    field = static_cast<std::remove_reference_t<decltype(field)>>(x);
    return OkStatus();
  };
  if (name == "workers") return intIn(kWorkersRange, s.numWorkers);
  if (name == "id") return intIn(kIdRange, s.id);
  if (name == "servers") return intIn(kServersRange, s.numServers);
  if (name == "engines") return intIn(kAggEngines, s.engineThreads);
  if (name == "first-iteration") return intIn(kFirstIterationRange, s.engine.firstIteration);
  if (name == "round-timeout-ms") return intIn(kAggRoundTimeoutMs, s.engine.roundTimeoutMs);
  if (name == "gradient-stragglers") return intIn(kStragglersRange, s.engine.gradientStragglers);
  if (name == "dead-worker-ms") return intIn(kAggDeadWorkerMs, s.engine.deadWorkerMs);
  if (name == "backup-ack-timeout-ms") {
    return intIn(kAggBackupAckTimeoutMs, s.engine.backupAckTimeoutMs);
  }
  if (name == "max-chunk-bytes") return intIn(kAggMaxChunk, s.maxChunkBytes);
  if (name == "drain-timeout-ms") return intIn(kAggDrainMs, s.drainTimeoutMs);
  if (name == "staleness") return intIn(kAggStaleness, s.engine.staleness);
  if (name == "version-staleness") return intIn(kAggVersionStaleness, s.engine.versionStaleness);
  if (name == "credit-bytes") return intIn(kAggCreditBytes, s.creditBytes);
  if (name == "connect-timeout-ms") return intIn(kConnectTimeoutRange, c.connectTimeoutMs);
  if (name == "replication") {
    COFAB_ASSIGN_OR_RETURN(s.replication, parseBool(name, v));
  } else if (name == "store") {
    c.storeUrl = v;
  } else if (name == "store-prefix") {
    c.storePrefix = v;
  } else if (name == "peers") {
    c.peers.clear();
    std::stringstream ss(v);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) c.peers.push_back(item);
    }
  } else if (name == "transport") {
    s.transport = v;
  } else if (name == "listen") {
    s.listenAddress = v;
  } else if (name == "http") {
    c.http = v;
  } else {
    return InvalidArgument("unknown option '" + name + "'\n" + daemonUsage());
  }
  return OkStatus();
}

}  // namespace

StatusOr<DaemonConfig> parseDaemonArgs(const std::vector<std::string>& args) {
  DaemonConfig c;
  // Environment first (lowest precedence), then the config file, then flags.
  COFAB_ASSIGN_OR_RETURN(c.server.transport, kAggTransport.get());
  COFAB_ASSIGN_OR_RETURN(c.server.listenAddress, kAggListen.get());
  COFAB_ASSIGN_OR_RETURN(int64_t engines, kAggEngines.get());
  c.server.engineThreads = static_cast<int>(engines);
  COFAB_ASSIGN_OR_RETURN(c.server.replication, kAggReplication.get());
  COFAB_ASSIGN_OR_RETURN(c.server.engine.roundTimeoutMs, kAggRoundTimeoutMs.get());
  COFAB_ASSIGN_OR_RETURN(c.server.engine.deadWorkerMs, kAggDeadWorkerMs.get());
  COFAB_ASSIGN_OR_RETURN(c.server.engine.backupAckTimeoutMs, kAggBackupAckTimeoutMs.get());
  COFAB_ASSIGN_OR_RETURN(int64_t maxChunk, kAggMaxChunk.get());
  c.server.maxChunkBytes = static_cast<size_t>(maxChunk);
  COFAB_ASSIGN_OR_RETURN(c.server.drainTimeoutMs, kAggDrainMs.get());
  COFAB_ASSIGN_OR_RETURN(c.server.engine.staleness, kAggStaleness.get());
  COFAB_ASSIGN_OR_RETURN(c.server.engine.versionStaleness, kAggVersionStaleness.get());
  COFAB_ASSIGN_OR_RETURN(int64_t creditBytes, kAggCreditBytes.get());
  c.server.creditBytes = static_cast<size_t>(creditBytes);
  COFAB_ASSIGN_OR_RETURN(c.http, kAggHttp.get());
  COFAB_ASSIGN_OR_RETURN(c.storePrefix, kAggPrefix.get());
  COFAB_ASSIGN_OR_RETURN(int64_t roleRank, kRoleRank.get());
  COFAB_ASSIGN_OR_RETURN(int64_t roleSize, kRoleSize.get());
  // Those two take any cofab-run role's range; a daemon's must also fit --id / --servers.
  COFAB_ASSIGN_OR_RETURN(roleRank, parseIntIn(std::to_string(roleRank), "COFAB_ROLE_RANK (--id)",
                                              kIdRange.min, kIdRange.max));
  COFAB_ASSIGN_OR_RETURN(roleSize,
                         parseIntIn(std::to_string(roleSize), "COFAB_ROLE_SIZE (--servers)",
                                    kServersRange.min, kServersRange.max));
  c.server.id = static_cast<int>(roleRank);
  c.server.numServers = static_cast<int>(roleSize);
  std::string raw;
  if (rawParamValue("COFAB_WORLD_SIZE", &raw)) {
    COFAB_ASSIGN_OR_RETURN(
        int64_t w, parseIntIn(raw, "COFAB_WORLD_SIZE", kWorkersRange.min, kWorkersRange.max));
    c.server.numWorkers = static_cast<int>(w);
  } else {
    c.server.numWorkers = 0;
  }
  if (rawParamValue("COFAB_STORE", &raw)) c.storeUrl = raw;

  std::vector<std::pair<std::string, std::string>> flags;
  COFAB_ASSIGN_OR_RETURN(std::string configFile, kAggConfig.get());
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      c.help = true;
      return c;
    }
    if (a.rfind("--", 0) != 0)
      return InvalidArgument("unexpected argument '" + a + "'\n" + daemonUsage());
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      if (i + 1 >= args.size()) return InvalidArgument("--" + name + " needs a value");
      value = args[++i];
    }
    if (name == "config") {
      configFile = value;
    } else {
      flags.emplace_back(name, value);
    }
  }
  bool serversGiven = false;  // by a flag or the config file, not only by cofab-run's role size
  if (!configFile.empty()) {
    std::map<std::string, std::string> file;
    COFAB_RETURN_IF_ERROR(readConfigFile(configFile, &file));
    for (const auto& [k, v] : file) {
      COFAB_RETURN_IF_ERROR(apply(c, k, v).withContext("config file '" + configFile + "'"));
      serversGiven |= k == "servers";
    }
  }
  for (const auto& [k, v] : flags) {
    COFAB_RETURN_IF_ERROR(apply(c, k, v));
    serversGiven |= k == "servers";
  }
  if (!c.peers.empty()) {
    // --peers names every daemon: a --servers that counts differently was silently replaced.
    if (serversGiven && c.server.numServers != static_cast<int>(c.peers.size())) {
      return InvalidArgument("--servers " + std::to_string(c.server.numServers) +
                             " disagrees with the " + std::to_string(c.peers.size()) +
                             " addresses of --peers (leave --servers out)");
    }
    c.server.numServers = static_cast<int>(c.peers.size());
    if (c.server.id < 0 || c.server.id >= c.server.numServers) {
      return InvalidArgument("--id " + std::to_string(c.server.id) + " outside --peers");
    }
    if (c.server.listenAddress.empty()) {
      c.server.listenAddress = c.peers[static_cast<size_t>(c.server.id)];
    }
  } else if (c.storeUrl.empty()) {
    return InvalidArgument("cofab-aggd needs --store URL (or COFAB_STORE) or --peers\n" +
                           daemonUsage());
  }
  if (c.server.numWorkers <= 0) {
    return InvalidArgument("cofab-aggd needs --workers N (or COFAB_WORLD_SIZE)\n" + daemonUsage());
  }
  COFAB_RETURN_IF_ERROR(checkHttpAddress(c.http));
  return c;
}

}  // namespace cofab::aggregator
