// cofab-coded's flag parsing and result check (fabric/bin/cofab_coded_cli.h): every malformed,
// out-of-range or unknown flag is InvalidArgument naming it (atoi read "--n=8x" as 8, "--index=x"
// as worker 0, "--rows=-1" reached a vector size as size_t(-256)); a product with a NaN or inf
// entry fails the check (std::max(err, NaN) kept err, so an all-NaN decode passed with error 0).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fabric/bin/cofab_coded_cli.h"

namespace cofab::coded::cli {
namespace {

constexpr const char* kStore = "file:///tmp/cofab-coded-flags-test-unused";

TEST(CofabCodedFlags, MasterDefaultsAndValidValues) {
  auto d = parseMasterArgs({}, kStore);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->store, kStore);
  EXPECT_EQ(d->service.n, 8);
  EXPECT_EQ(d->service.k, 6);
  EXPECT_EQ(d->rows, 960);
  EXPECT_EQ(d->cols, 256);
  EXPECT_EQ(d->bCols, 16);
  EXPECT_EQ(d->requests, 10);

  auto c = parseMasterArgs(
      {"--store=tcp://h:1", "--mode=replicated", "--n=4", "--k=3", "--replicas=2", "--rows=50",
       "--cols=16", "--bcols=3", "--requests=3", "--shift_ms=1.5", "--tail_ms=0", "--name=svc"},
      "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->store, "tcp://h:1");
  EXPECT_EQ(c->service.mode, CodedMode::kReplicated);
  EXPECT_EQ(c->service.n, 4);
  EXPECT_EQ(c->service.k, 3);
  EXPECT_EQ(c->rows, 50);
  EXPECT_EQ(c->bCols, 3);
  EXPECT_EQ(c->requests, 3);
  EXPECT_DOUBLE_EQ(c->service.shiftMs, 1.5);
  EXPECT_EQ(c->service.name, "svc");
}

TEST(CofabCodedFlags, MasterRejectsMalformedAndOutOfRangeValuesNamingTheFlag) {
  struct Case {
    std::string arg, flag;
  };
  const std::vector<Case> cases = {
      {"--rows=-1", "--rows"},
      {"--rows=0", "--rows"},
      {"--rows=99999999999999999999", "--rows"},
      {"--cols=abc", "--cols"},
      {"--bcols=", "--bcols"},
      {"--requests=abc", "--requests"},
      {"--requests=-5", "--requests"},
      {"--requests=0", "--requests"},
      {"--n=8x", "--n"},
      {"--n=65", "--n"},
      {"--k=0", "--k"},
      {"--replicas=two", "--replicas"},
      {"--shift_ms=nan", "--shift_ms"},
      {"--tail_ms=1x", "--tail_ms"},
      {"--tail_ms=-1", "--tail_ms"},
      {"--shift_ms=inf", "--shift_ms"},
      {"--mode=fast", "fast"},
  };
  for (const Case& c : cases) {
    auto r = parseMasterArgs({c.arg}, kStore);
    ASSERT_FALSE(r.ok()) << c.arg << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.arg;
    EXPECT_NE(r.status().message().find(c.flag), std::string::npos) << c.arg << ": " << r.status();
  }
}

TEST(CofabCodedFlags, MasterRejectsMatricesTooLargeToAllocate) {
  auto r = parseMasterArgs({"--rows=65536", "--cols=65536"}, kStore);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--rows=65536"), std::string::npos) << r.status();
}

TEST(CofabCodedFlags, UnknownOrMisspelledFlagsAndBadFormsAreErrors) {
  auto misspelled = parseMasterArgs({"--request=5"}, kStore);
  ASSERT_FALSE(misspelled.ok());
  EXPECT_NE(misspelled.status().message().find("unknown flag --request"), std::string::npos)
      << misspelled.status();
  // --index is a worker flag, not a master one.
  EXPECT_FALSE(parseMasterArgs({"--index=1"}, kStore).ok());
  EXPECT_FALSE(parseMasterArgs({"rows=5"}, kStore).ok());
  EXPECT_FALSE(parseMasterArgs({"--rows"}, kStore).ok());
  EXPECT_FALSE(parseMasterArgs({"--=5"}, kStore).ok());
  EXPECT_FALSE(parseWorkerArgs({"--index=1", "--rows=5"}, kStore, "").ok());
}

TEST(CofabCodedFlags, StoreIsRequired) {
  auto m = parseMasterArgs({}, "");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--store"), std::string::npos) << m.status();
  auto w = parseWorkerArgs({"--index=0"}, "", "");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--store"), std::string::npos) << w.status();
}

TEST(CofabCodedFlags, WorkerIndexIsStrict) {
  auto flag = parseWorkerArgs({"--index=3", "--name=svc"}, kStore, "5");
  ASSERT_TRUE(flag.ok()) << flag.status();
  EXPECT_EQ(flag->index, 3);  // the flag wins over COFAB_ROLE_RANK
  EXPECT_EQ(flag->name, "svc");
  auto env = parseWorkerArgs({}, kStore, "5");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->index, 5);

  for (const char* bad : {"x", "", "-1", "1x", "64"}) {
    auto r = parseWorkerArgs({std::string("--index=") + bad}, kStore, "");
    ASSERT_FALSE(r.ok()) << "--index=" << bad << " was accepted";
    EXPECT_NE(r.status().message().find("--index"), std::string::npos) << r.status();
  }
  auto badEnv = parseWorkerArgs({}, kStore, "x");
  ASSERT_FALSE(badEnv.ok());
  EXPECT_NE(badEnv.status().message().find("COFAB_ROLE_RANK"), std::string::npos)
      << badEnv.status();
  auto none = parseWorkerArgs({}, kStore, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--index"), std::string::npos) << none.status();
}

TEST(CofabCodedProductCheck, NaNOrInfAnywhereIsAMismatch) {
  const std::vector<float> ref = {1.0f, -2.0f, 3.0f, 0.5f};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  const ProductCheck exact = checkProduct(ref.data(), ref.data(), ref.size());
  EXPECT_TRUE(exact.ok);
  EXPECT_EQ(exact.nonFinite, 0u);
  EXPECT_EQ(exact.maxAbsError, 0.0);

  std::vector<float> allNan(ref.size(), nan);
  const ProductCheck a = checkProduct(allNan.data(), ref.data(), ref.size());
  EXPECT_FALSE(a.ok);
  EXPECT_EQ(a.nonFinite, ref.size());

  std::vector<float> oneNan = ref;
  oneNan[2] = nan;
  const ProductCheck b = checkProduct(oneNan.data(), ref.data(), ref.size());
  EXPECT_FALSE(b.ok);
  EXPECT_EQ(b.nonFinite, 1u);

  std::vector<float> oneInf = ref;
  oneInf[0] = -inf;
  EXPECT_FALSE(checkProduct(oneInf.data(), ref.data(), ref.size()).ok);

  // A non-finite reference is no match either.
  std::vector<float> refNan = ref;
  refNan[1] = nan;
  EXPECT_FALSE(checkProduct(ref.data(), refNan.data(), ref.size()).ok);
}

TEST(CofabCodedProductCheck, FiniteErrorsAgainstTheTolerance) {
  const std::vector<float> ref = {100.0f, -2.0f, 3.0f};
  std::vector<float> close = ref;
  close[1] += 0.05f;  // 5e-4 of the scale 100
  const ProductCheck ok = checkProduct(close.data(), ref.data(), ref.size());
  EXPECT_TRUE(ok.ok);
  EXPECT_NEAR(ok.maxAbsError, 0.05, 1e-6);
  EXPECT_DOUBLE_EQ(ok.scale, 100.0);

  std::vector<float> far = ref;
  far[2] += 1.0f;  // 1e-2 of the scale
  const ProductCheck bad = checkProduct(far.data(), ref.data(), ref.size());
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.nonFinite, 0u);
}

}  // namespace
}  // namespace cofab::coded::cli
