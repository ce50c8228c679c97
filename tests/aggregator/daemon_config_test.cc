// cofab-aggd's flags and config file: values outside what the daemon can use are refused with a
// message naming the flag, never narrowed into something else.
#include "aggregator/daemon_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/param.h"
#include "tests/support/temp_dir.h"

namespace cofab::aggregator {
namespace {

StatusOr<DaemonConfig> parse(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--store", "tcp://127.0.0.1:1", "--workers", "4"};
  args.insert(args.end(), extra.begin(), extra.end());
  return parseDaemonArgs(args);
}

TEST(DaemonConfigTest, ValuesOutOfRangeAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--workers", "4294967297"},  // used to wrap to 1
      {"--workers", "0"},
      {"--max-chunk-bytes", "-1"},  // used to become SIZE_MAX
      {"--max-chunk-bytes", "0"},   // would refuse every chunk
      {"--first-iteration", "-1"},  // used to become UINT64_MAX
      {"--round-timeout-ms", "-5"},
      {"--dead-worker-ms", "-1"},
      {"--drain-timeout-ms", "-1"},
      {"--credit-bytes", "-1"},
      {"--engines", "0"},
      {"--id", "-1"},
      {"--servers", "0"},
      {"--gradient-stragglers", "-1"},
      {"--connect-timeout-ms", "0"},
      {"--staleness", "12abc"},
      {"--http", "127.0.0.1:abc"},  // used to bind an ephemeral port
      {"--http", "127.0.0.1:70000"},
      {"--http", "nocolon"},
  };
  for (const auto& [flag, value] : bad) {
    auto c = parse({flag, value});
    ASSERT_FALSE(c.ok()) << flag << " " << value << " was accepted";
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
    EXPECT_NE(c.status().message().find(flag), std::string::npos)
        << flag << " " << value << ": " << c.status();
  }
}

TEST(DaemonConfigTest, ValuesInRangeAreTaken) {
  auto c = parse({"--max-chunk-bytes", "1048576", "--first-iteration", "7", "--engines", "3",
                  "--http", "off", "--credit-bytes", "0", "--round-timeout-ms=250"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.numWorkers, 4);
  EXPECT_EQ(c->server.maxChunkBytes, 1048576u);
  EXPECT_EQ(c->server.engine.firstIteration, 7u);
  EXPECT_EQ(c->server.engineThreads, 3);
  EXPECT_EQ(c->server.engine.roundTimeoutMs, 250);
  EXPECT_EQ(c->http, "off");
}

// The config file goes through the same checks, and the error names the file.
TEST(DaemonConfigTest, AConfigFileLineOutOfRangeIsRefusedNamingTheFile) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/aggd.conf";
  std::ofstream(path) << "# daemon\nworkers = 4294967297\n";
  auto c = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--config", path});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--workers"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status();
}

// A name set twice is refused with both lines (which one was meant is a guess), and a
// directory is not an empty config file.
TEST(DaemonConfigTest, AConfigFileThatSetsANameTwiceOrIsADirectoryIsRefused) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/aggd.conf";
  std::ofstream(path) << "workers = 4\n# comment\nengines = 2\nworkers = 8\n";
  auto twice = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--config", path});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status();
  EXPECT_NE(twice.status().message().find(path + ":4"), std::string::npos) << twice.status();
  EXPECT_NE(twice.status().message().find("first at line 1"), std::string::npos)
      << twice.status();
  auto directory = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--config", dir.path()});
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("regular file"), std::string::npos)
      << directory.status();
}

// --peers names every daemon: a --servers that counts otherwise is an error, not replaced.
TEST(DaemonConfigTest, ServersThatDisagreeWithPeersAreRefused) {
  auto bad = parse({"--peers", "127.0.0.1:7001,127.0.0.1:7002", "--servers", "3", "--id", "0"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--servers 3"), std::string::npos) << bad.status();
  auto agree = parse({"--peers", "127.0.0.1:7001,127.0.0.1:7002", "--servers", "2", "--id", "1"});
  ASSERT_TRUE(agree.ok()) << agree.status();
  EXPECT_EQ(agree->server.numServers, 2);
  auto implied = parse({"--peers", "127.0.0.1:7001,127.0.0.1:7002", "--id", "1"});
  ASSERT_TRUE(implied.ok()) << implied.status();
  EXPECT_EQ(implied->server.numServers, 2);
}

TEST(DaemonConfigTest, OnOffFlagsTakeWhatTheEnvironmentTakes) {
  // COFAB_AGG_REPLICATION=ON works, so --replication ON must too (it used to be refused).
  for (const char* on : {"ON", "True", "YES", "1"}) {
    auto c = parse({"--replication", on});
    ASSERT_TRUE(c.ok()) << on << ": " << c.status();
    EXPECT_TRUE(c->server.replication) << on;
  }
  for (const char* off : {"Off", "FALSE", "no", "0"}) {
    auto c = parse({"--replication", off});
    ASSERT_TRUE(c.ok()) << off << ": " << c.status();
    EXPECT_FALSE(c->server.replication) << off;
  }
  auto bad = parse({"--replication", "maybe"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--replication"), std::string::npos) << bad.status();
}

TEST(DaemonConfigTest, AWorldSizeFromTheEnvironmentIsCheckedToo) {
  ScopedParamOverride world("COFAB_WORLD_SIZE", "-3");
  auto c = parseDaemonArgs({"--store", "tcp://127.0.0.1:1"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("COFAB_WORLD_SIZE"), std::string::npos) << c.status();
}

// COFAB_ROLE_RANK / COFAB_ROLE_SIZE take up to 2^20 (cofab-run's roles in general), but a daemon
// id and count must fit what --id and --servers take: checked against those, naming the variable.
TEST(DaemonConfigTest, ARoleFromTheEnvironmentIsCheckedAgainstTheDaemonsRanges) {
  {
    ScopedParamOverride size("COFAB_ROLE_SIZE", "100000");
    auto c = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--workers", "4"});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find("COFAB_ROLE_SIZE"), std::string::npos) << c.status();
  }
  {
    ScopedParamOverride rank("COFAB_ROLE_RANK", "70000");
    auto c = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--workers", "4"});
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("COFAB_ROLE_RANK"), std::string::npos) << c.status();
  }
  ScopedParamOverride rank("COFAB_ROLE_RANK", "3");
  ScopedParamOverride size("COFAB_ROLE_SIZE", "4");
  auto c = parseDaemonArgs({"--store", "tcp://127.0.0.1:1", "--workers", "4"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.id, 3);
  EXPECT_EQ(c->server.numServers, 4);
}

}  // namespace
}  // namespace cofab::aggregator
