// train_mnist's command line (examples/train_mnist/train_options.h): values that strtol /
// strtoull used to read as something else ("" as 0, -1 as 2^64-1, 4294967424 truncated to 128,
// "3x" as 3) are InvalidArgument naming the option, and a --limit below --batch (an epoch of no
// step: NaN loss, no training, yet a final accuracy and exit 0) is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "examples/train_mnist/train_options.h"

namespace cofab::examples {
namespace {

TEST(TrainOptions, DefaultsAndValidValues) {
  auto d = parseTrainOptions({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->epochs, 5);
  EXPECT_EQ(d->batch, 128);
  EXPECT_EQ(d->limit, 0u);
  EXPECT_EQ(d->sync, "local");
  EXPECT_EQ(d->algo.slowRank, -1);

  auto o = parseTrainOptions({"--epochs",    "1",          "--limit",
                              "6000",        "--batch",    "64",
                              "--lr",        "0.1",        "--momentum",
                              "0",           "--seed",     "7",
                              "--slow-rank", "3",          "--slow-factor",
                              "2",           "--sync",     "gradcode",
                              "--nesterov",  "off",        "--shadow-interval-ms",
                              "50",          "--data-dir", "/tmp/x"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->epochs, 1);
  EXPECT_EQ(o->limit, 6000u);
  EXPECT_EQ(o->batch, 64);
  EXPECT_FLOAT_EQ(o->lr, 0.1f);
  EXPECT_EQ(o->momentum, 0.0f);
  EXPECT_EQ(o->seed, 7u);
  EXPECT_EQ(o->algo.slowRank, 3);
  EXPECT_DOUBLE_EQ(o->algo.slowFactor, 2.0);
  EXPECT_EQ(o->sync, "gradcode");
  EXPECT_FALSE(o->algo.onebitNesterov);
  EXPECT_EQ(o->algo.shadowIntervalMs, 50);
  EXPECT_EQ(o->dataDir, "/tmp/x");
}

TEST(TrainOptions, MalformedEmptyAndOutOfRangeValuesNameTheOption) {
  const std::vector<std::vector<std::string>> cases = {
      {"--slow-rank", ""},
      {"--limit", "-1"},
      {"--batch", "4294967424"},
      {"--batch", "0"},
      {"--epochs", "3x"},
      {"--epochs", "0"},
      {"--hidden", "abc"},
      {"--lr", "0"},
      {"--lr", "nan"},
      {"--lr", ""},
      {"--momentum", "1"},
      {"--momentum", "-0.1"},
      {"--seed", "-1"},
      {"--slow-factor", "0.5"},
      {"--device-ms", "-5"},
      {"--elastic-alpha", "1"},
      {"--reply-feedback", "yes"},
      {"--threads", "0"},
      {"--gradcode-window", "0"},
      {"--compression-block", "-4"},
      {"--sync-every", "1.5"},
  };
  for (const auto& args : cases) {
    auto r = parseTrainOptions(args);
    ASSERT_FALSE(r.ok()) << args[0] << " '" << args[1] << "' was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(args[0]), std::string::npos) << r.status();
  }
}

TEST(TrainOptions, UnknownOptionsAndMissingValuesAreErrors) {
  auto unknown = parseTrainOptions({"--epoch", "1"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown option --epoch"), std::string::npos)
      << unknown.status();
  auto missing = parseTrainOptions({"--epochs", "1", "--batch"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--batch needs a value"), std::string::npos)
      << missing.status();
}

// The sync algorithms' options with a gradient path (--sync local, aggregator): refused, naming
// the option. They were parsed and dropped: --slow-rank 1 ran with no slow rank.
TEST(TrainOptions, AlgorithmOptionsOutsideTheSyncAlgorithmsAreRefused) {
  for (const char* sync : {"local", "aggregator"}) {
    auto o = parseTrainOptions({"--sync", sync, "--slow-rank", "1"});
    ASSERT_FALSE(o.ok()) << sync;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("--slow-rank applies to the sync algorithms"),
              std::string::npos)
        << o.status();
  }
  EXPECT_FALSE(parseTrainOptions({"--threads", "2"}).ok()) << "the default --sync is local";
  EXPECT_TRUE(parseTrainOptions({"--sync", "ssp", "--slow-rank", "1"}).ok());
}

// A misspelt --sync is named as such, also next to an algorithm's option: with one, the error
// said the option did not apply to "--sync easgb", and without one parsing passed and the run
// failed later.
TEST(TrainOptions, AnUnknownSyncModeIsNamed) {
  for (auto args : {std::vector<std::string>{"--sync", "easgb", "--elastic-alpha", "0.2"},
                    std::vector<std::string>{"--sync", "easgb"}}) {
    auto o = parseTrainOptions(args);
    ASSERT_FALSE(o.ok()) << args.size();
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("--sync 'easgb' is not one of"), std::string::npos)
        << o.status();
  }
}

TEST(TrainOptions, LimitBelowTheBatchIsRefused) {
  auto r = parseTrainOptions({"--limit", "100", "--batch", "128"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no step of --batch 128"), std::string::npos) << r.status();
  // Exactly one step per epoch is enough; no --limit is checked against the loaded data.
  EXPECT_TRUE(parseTrainOptions({"--limit", "128", "--batch", "128"}).ok());
  EXPECT_TRUE(parseTrainOptions({"--batch", "100000"}).ok());

  EXPECT_FALSE(requireOneStepPerEpoch(100, 128).ok());
  EXPECT_FALSE(requireOneStepPerEpoch(0, 1).ok());
  EXPECT_TRUE(requireOneStepPerEpoch(128, 128).ok());
  EXPECT_TRUE(requireOneStepPerEpoch(60000, 128).ok());
}

}  // namespace
}  // namespace cofab::examples
