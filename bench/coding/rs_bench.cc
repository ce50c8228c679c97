// Reed-Solomon encode and decode throughput: cofab's ReedSolomon against raw ISA-L calls on the
// same buffers in the same run, for (k, m) in {(10,4), (8,3), (20,4)} and shards of 4 KiB to
// 4 MiB. Each case alternates cofab and ISA-L call by call on equal buffers and takes the median
// thread-CPU time of each (the machine is shared: wall time would also count other processes).
// GB/s count the k data shards' bytes per operation (what the caller protects), for encode and
// decode alike; decode rebuilds m erasures (half data, half parity) with the decode tables
// already cached on both sides, so both measure the steady state.
//
//   build-coding/bench/coding/coding_rs_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <map>
#include <random>

#include "bench/coding/bench_args.h"
#include "bench/support/result_reporter.h"
#include "coding/erasure/reed_solomon.h"
#include "core/config.h"

#if COFAB_HAVE_ISAL
#include <isa-l/erasure_code.h>
#endif

namespace cofab::coding {
namespace {

constexpr std::pair<int, int> kCodes[] = {{10, 4}, {8, 3}, {20, 4}};
constexpr int64_t kShards[] = {4096, 65536, 1048576, 4194304};

struct Buffers {
  Buffers(int k, int m, size_t bytes) {
    std::mt19937_64 rng(k * 1000 + m);
    storage.resize(k + m);
    for (auto& s : storage) {
      s.resize(bytes);
      for (auto& b : s) b = static_cast<uint8_t>(rng());
    }
    for (auto& s : storage) ptrs.push_back(s.data());
  }
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> ptrs;
};

// Erase m shards: the first half of them data shards, the rest parity.
std::vector<int> erasuresFor(int k, int m) {
  std::vector<int> e;
  for (int i = 0; i < m / 2; ++i) e.push_back(i * 2);
  for (int i = 0; e.size() < static_cast<size_t>(m); ++i) e.push_back(k + i);
  return e;
}

// Thread CPU time: a preempted call on this shared machine is not charged for the other process.
int64_t threadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Times `a` and `b` alternately (swapping which goes first every round) and reports the median
// GB/s of each as counters, so that both see the same machine conditions.
template <typename A, typename B>
void pairedRounds(benchmark::State& state, double bytes, A&& a, B&& b) {
  std::vector<double> ta, tb;
  bool aFirst = true;
  for (auto _ : state) {
    for (int half = 0; half < 2; ++half) {
      const bool runA = (half == 0) == aFirst;
      const int64_t t0 = threadCpuNs();
      if (runA) {
        a();
      } else {
        b();
      }
      benchmark::ClobberMemory();
      (runA ? ta : tb).push_back(static_cast<double>(threadCpuNs() - t0));
    }
    aFirst = !aFirst;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["a_gbps"] = bytes / std::max(1.0, median(ta));
  state.counters["b_gbps"] = bytes / std::max(1.0, median(tb));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes) * 2);
}

#if COFAB_HAVE_ISAL
// ISA-L's own tables: the generator's parity rows for encode, and the decode matrix for the
// erasures built the way ISA-L's ec_simple_example does.
struct IsalTables {
  IsalTables(int k, int m, const std::vector<int>& erasures, const std::vector<uint8_t*>& shards) {
    std::vector<uint8_t> enc((k + m) * k), b(k * k), inv(k * k), dec(k * m);
    encode.resize(32 * k * m);
    decode.resize(32 * k * m);
    gf_gen_cauchy1_matrix(enc.data(), k + m, k);
    ec_init_tables(k, m, &enc[k * k], encode.data());
    std::vector<bool> err(k + m);
    for (int e : erasures) err[e] = true;
    for (int i = 0, r = 0; i < k; ++i, ++r) {
      while (err[r]) ++r;
      std::copy_n(&enc[k * r], k, &b[k * i]);
      srcs.push_back(shards[r]);
    }
    gf_invert_matrix(b.data(), inv.data(), k);
    for (size_t p = 0; p < erasures.size(); ++p) {
      const int e = erasures[p];
      for (int i = 0; i < k; ++i) {
        if (e < k) {
          dec[k * p + i] = inv[k * e + i];
        } else {
          uint8_t s = 0;
          for (int j = 0; j < k; ++j) s ^= gf_mul(inv[j * k + i], enc[k * e + j]);
          dec[k * p + i] = s;
        }
      }
      outs.push_back(shards[e]);
    }
    ec_init_tables(k, static_cast<int>(erasures.size()), dec.data(), decode.data());
  }
  std::vector<uint8_t> encode, decode;
  std::vector<uint8_t*> srcs, outs;
};
#endif

// a = cofab's ReedSolomon, b = raw ISA-L (or cofab's reference codec without ISA-L).
void BM_EncodePair(benchmark::State& state) {
  const int k = state.range(0), m = state.range(1);
  const int64_t shard = state.range(2);
  auto rs = ReedSolomon::create({.dataShards = k, .parityShards = m});
  Buffers buf(k, m, shard), buf2(k, m, shard);
  std::vector<const uint8_t*> data(buf.ptrs.begin(), buf.ptrs.begin() + k);
  std::vector<uint8_t*> parity(buf.ptrs.begin() + k, buf.ptrs.end());
  auto cofab = [&] {
    if (!rs->encode(data, parity, shard).ok()) state.SkipWithError("encode failed");
  };
#if COFAB_HAVE_ISAL
  IsalTables t(k, m, erasuresFor(k, m), buf2.ptrs);
  auto other = [&] {
    ec_encode_data(static_cast<int>(shard), k, m, t.encode.data(), buf2.ptrs.data(),
                   buf2.ptrs.data() + k);
  };
#else
  auto other = cofab;
#endif
  pairedRounds(state, static_cast<double>(k) * shard, cofab, other);
}

void BM_DecodePair(benchmark::State& state) {
  const int k = state.range(0), m = state.range(1);
  const int64_t shard = state.range(2);
  auto rs = ReedSolomon::create({.dataShards = k, .parityShards = m});
  Buffers buf(k, m, shard), buf2(k, m, shard);
  std::vector<const uint8_t*> data(buf.ptrs.begin(), buf.ptrs.begin() + k);
  std::vector<uint8_t*> parity(buf.ptrs.begin() + k, buf.ptrs.end());
  (void)rs->encode(data, parity, shard).ok();
  const std::vector<int> erasures = erasuresFor(k, m);
  auto cofab = [&] {
    if (!rs->decode(buf.ptrs, erasures, shard).ok()) state.SkipWithError("decode failed");
  };
#if COFAB_HAVE_ISAL
  IsalTables t(k, m, erasures, buf2.ptrs);
  auto other = [&] {
    ec_encode_data(static_cast<int>(shard), k, static_cast<int>(erasures.size()), t.decode.data(),
                   t.srcs.data(), t.outs.data());
  };
#else
  auto other = cofab;
#endif
  pairedRounds(state, static_cast<double>(k) * shard, cofab, other);
}

void BM_ReferenceEncode(benchmark::State& state) {
  const int k = state.range(0), m = state.range(1);
  const int64_t shard = state.range(2);
  auto rs =
      ReedSolomon::create({.dataShards = k, .parityShards = m, .backend = RsBackend::kReference});
  Buffers buf(k, m, shard);
  std::vector<const uint8_t*> data(buf.ptrs.begin(), buf.ptrs.begin() + k);
  std::vector<uint8_t*> parity(buf.ptrs.begin() + k, buf.ptrs.end());
  for (auto _ : state) {
    (void)rs->encode(data, parity, shard).ok();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * k * shard);
}

void registerAll() {
  for (auto [k, m] : kCodes) {
    for (int64_t shard : kShards) {
      using Fn = void (*)(benchmark::State&);
      for (auto [name, fn] : {std::pair<const char*, Fn>{"BM_EncodePair", BM_EncodePair},
                              std::pair<const char*, Fn>{"BM_DecodePair", BM_DecodePair}}) {
        benchmark::RegisterBenchmark(name, fn)
            ->Args({k, m, shard})
            ->MinTime(0.2)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::RegisterBenchmark("BM_ReferenceEncode", BM_ReferenceEncode)
      ->Args({10, 4, 1048576})
      ->MinTime(0.1)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace
}  // namespace cofab::coding

int main(int argc, char** argv) {
  using namespace cofab::coding;
  using cofab::bench::num;
  registerAll();
  benchargs::Args args(argc, argv, {});
  auto cases = cofab::bench::runBenchmarks(args.argc(), args.argv());
  benchargs::endConsoleOutput();
  auto counter = [&](const std::string& name, const char* key) {
    const auto* c = cofab::bench::findCase(cases, name + "/");
    if (c == nullptr) return 0.0;
    auto it = c->counters.find(key);
    return it == c->counters.end() ? 0.0 : it->second;
  };
  for (auto [k, m] : kCodes) {
    for (int64_t shard : kShards) {
      const std::string args =
          "/" + std::to_string(k) + "/" + std::to_string(m) + "/" + std::to_string(shard);
      const double ce = counter("BM_EncodePair" + args, "a_gbps");
      const double ie = counter("BM_EncodePair" + args, "b_gbps");
      const double cd = counter("BM_DecodePair" + args, "a_gbps");
      const double id = counter("BM_DecodePair" + args, "b_gbps");
      if (ce == 0 && cd == 0) continue;  // filtered out
      cofab::bench::printResult("rs", {{"k", std::to_string(k)},
                                       {"m", std::to_string(m)},
                                       {"shard", std::to_string(shard)},
                                       {"cofab_gbps", num(ce)},
                                       {"isal_gbps", COFAB_HAVE_ISAL ? num(ie) : "n/a"},
                                       {"cofab_decode_gbps", num(cd)},
                                       {"isal_decode_gbps", COFAB_HAVE_ISAL ? num(id) : "n/a"},
                                       {"encode_ratio", num(ie > 0 ? ce / ie : 0, 3)},
                                       {"decode_ratio", num(id > 0 ? cd / id : 0, 3)},
                                       {"erasures", std::to_string(m)},
                                       {"counted", "data_bytes"}});
    }
  }
  const auto* ref = cofab::bench::findCase(cases, "BM_ReferenceEncode/10/4/1048576");
  if (ref != nullptr && ref->cpuTimeNs > 0) {
    cofab::bench::printResult("rs_reference", {{"k", "10"},
                                               {"m", "4"},
                                               {"shard", "1048576"},
                                               {"gbps", num(10.0 * 1048576 / ref->cpuTimeNs)}});
  }
  return 0;
}
