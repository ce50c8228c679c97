// The per-step model loops of the training-sync algorithms (fabric/sync/shared_model.h) on the
// example MLP's parameter count, for both SharedModel access modes, against memcpy (the limit
// of a read or write):
//
//   build/bench/sync/shared_model_bench [--benchmark_min_time=0.2s]
//
//   BM_Read/Write/Add<kConcurrent>    std::atomic<float> elements, relaxed (eawild threads > 1,
//                                     shadowsync)
//   BM_Read/Write/Add<kSingleThread>  plain floats (every other algorithm)
//   BM_Memcpy                         the same bytes copied
//   BM_MomentumUpdateScaled           ssp's v = m v + g, delta = scale v in one pass
// Ends with RESULT shared_model: microseconds per call of each.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "bench/support/result_reporter.h"
#include "fabric/sync/shared_model.h"

namespace cofab::bench {
namespace {

using sync::SharedModel;
constexpr size_t kFloats = 784 * 256 + 256 + 256 * 10 + 10;  // train_mnist's MLP 784-256-10

std::vector<float> ramp() {
  std::vector<float> v(kFloats);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1e-3f * float(i % 1000);
  return v;
}

template <SharedModel::Access A>
void BM_Read(benchmark::State& state) {
  SharedModel m(ramp(), A);
  std::vector<float> out(kFloats);
  for (auto _ : state) {
    m.read(out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
template <SharedModel::Access A>
void BM_Write(benchmark::State& state) {
  SharedModel m(ramp(), A);
  const std::vector<float> in = ramp();
  for (auto _ : state) {
    m.write(0, in);
    benchmark::ClobberMemory();
  }
}
template <SharedModel::Access A>
void BM_Add(benchmark::State& state) {
  SharedModel m(ramp(), A);
  const std::vector<float> delta = ramp();
  for (auto _ : state) {
    m.add(delta, -1e-6f);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Read<SharedModel::Access::kConcurrent>);
BENCHMARK(BM_Read<SharedModel::Access::kSingleThread>);
BENCHMARK(BM_Write<SharedModel::Access::kConcurrent>);
BENCHMARK(BM_Write<SharedModel::Access::kSingleThread>);
BENCHMARK(BM_Add<SharedModel::Access::kConcurrent>);
BENCHMARK(BM_Add<SharedModel::Access::kSingleThread>);

void BM_Memcpy(benchmark::State& state) {
  const std::vector<float> in = ramp();
  std::vector<float> out(kFloats);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), kFloats * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Memcpy);

void BM_MomentumUpdateScaled(benchmark::State& state) {
  sync::Momentum mom(kFloats, 0.9f);
  const std::vector<float> grad = ramp();
  std::vector<float> delta(kFloats);
  for (auto _ : state) {
    mom.updateScaled(grad, -0.0125f, delta);
    benchmark::DoNotOptimize(delta.data());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_MomentumUpdateScaled);

}  // namespace
}  // namespace cofab::bench

int main(int argc, char** argv) {
  using namespace cofab::bench;
  const auto cases = runBenchmarks(&argc, argv);
  auto us = [&](const char* name) {
    const CaseResult* c = findCase(cases, name);
    return c == nullptr ? std::string("nan") : num(c->realTimeNs / 1000.0);
  };
  printResult("shared_model",
              {{"floats", std::to_string(kFloats)},
               {"read_atomic_us", us("BM_Read<SharedModel::Access::kConcurrent>")},
               {"read_plain_us", us("BM_Read<SharedModel::Access::kSingleThread>")},
               {"write_atomic_us", us("BM_Write<SharedModel::Access::kConcurrent>")},
               {"write_plain_us", us("BM_Write<SharedModel::Access::kSingleThread>")},
               {"add_atomic_us", us("BM_Add<SharedModel::Access::kConcurrent>")},
               {"add_plain_us", us("BM_Add<SharedModel::Access::kSingleThread>")},
               {"memcpy_us", us("BM_Memcpy")},
               {"momentum_update_scaled_us", us("BM_MomentumUpdateScaled")}});
  return 0;
}
