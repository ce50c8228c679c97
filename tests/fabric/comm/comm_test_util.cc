#include "tests/fabric/comm/comm_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "core/half.h"

namespace cofab::comm::testing {

StatusOr<std::vector<std::unique_ptr<Communicator>>> makeComms(int n, Store* store,
                                                                const std::string& transport,
                                                                const std::string& name) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(n));
  std::vector<Status> statuses(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CommOptions o;
      o.transport = transport;
      o.name = name;
      o.setupTimeout = Millis(20000);
      auto c = Communicator::create(r, n, store, o);
      if (c.ok()) {
        comms[static_cast<size_t>(r)] = std::move(c).value();
      } else {
        statuses[static_cast<size_t>(r)] = c.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!statuses[static_cast<size_t>(r)].ok()) {
      return statuses[static_cast<size_t>(r)].withContext("rank " + std::to_string(r));
    }
  }
  return comms;
}

double inputValue(int pattern, int rank, size_t i) {
  if (pattern == 0) return static_cast<double>((rank * 31 + static_cast<int64_t>(i) * 7) % 13 - 6);
  // A cheap hash to [-1, 1).
  uint64_t x = (static_cast<uint64_t>(rank) << 40) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

std::vector<uint8_t> makeBuffer(DType dtype, size_t count) {
  return std::vector<uint8_t>(std::max<size_t>(1, count * dtypeSize(dtype)));
}

void setElement(DType dtype, void* data, size_t i, double v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = static_cast<float>(v); return;
    case DType::kF64: static_cast<double*>(data)[i] = v; return;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = floatToHalf(static_cast<float>(v)); return;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = floatToBf16(static_cast<float>(v)); return;
    case DType::kI32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); return;
    case DType::kI64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); return;
    case DType::kU8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); return;
  }
}

double getElement(DType dtype, const void* data, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kF16: return halfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DType::kU8: return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

double roundTo(DType dtype, double v) {
  uint8_t tmp[8];
  setElement(dtype, tmp, 0, v);
  return getElement(dtype, tmp, 0);
}

namespace {

// The inputs as the ranks hold them (already rounded to the dtype).
double held(DType dtype, int pattern, int rank, size_t i) {
  return roundTo(dtype, inputValue(pattern, rank, i));
}

double ulpHalf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -24);
    case DType::kF64: return std::ldexp(1.0, -53);
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    default: return 0;
  }
}

}  // namespace

double reference(DType dtype, ReduceOp op, int pattern, int n, size_t i) {
  double acc = held(dtype, pattern, 0, i);
  for (int r = 1; r < n; ++r) {
    const double x = held(dtype, pattern, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += x; break;
      case ReduceOp::kMin: acc = std::min(acc, x); break;
      case ReduceOp::kMax: acc = std::max(acc, x); break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if (dtype == DType::kI32 || dtype == DType::kI64) {
      acc = static_cast<double>(static_cast<int64_t>(acc) / n);
    } else if (dtype == DType::kF64) {
      acc = acc / n;
    } else {
      // The kernels divide in f32 (the accumulation type of f32, f16 and bf16).
      acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
    }
  }
  return roundTo(dtype, acc);
}

double tolerance(DType dtype, ReduceOp op, int pattern, int n, size_t i) {
  // Pattern 0's sums are exact; an f16 average divides every contribution first (1/n is not
  // exact in binary), so it is within the rounding bound below like the other patterns.
  if ((pattern == 0 && !avgPrescaled(dtype, op)) || op == ReduceOp::kMin || op == ReduceOp::kMax) {
    return 0;
  }
  if (dtype == DType::kI32 || dtype == DType::kI64) return 0;
  double sumAbs = 0;
  for (int r = 0; r < n; ++r) sumAbs += std::fabs(held(dtype, pattern, r, i));
  if (op == ReduceOp::kAvg) sumAbs /= n;
  // n - 1 combines + the final rounding + the division, each at most half an ulp of sum|x|
  // (accumulation type f32 for the 16-bit types adds less than that).
  const double u = ulpHalf(dtype) + (dtype == DType::kF64 ? 0 : std::ldexp(1.0, -24));
  return (n + 2) * u * 2 * sumAbs + std::numeric_limits<double>::min();
}

std::string checkReduced(DType dtype, ReduceOp op, int pattern, int n, const void* data,
                         size_t count, size_t offset) {
  for (size_t i = 0; i < count; ++i) {
    const double got = getElement(dtype, data, i);
    const double want = reference(dtype, op, pattern, n, offset + i);
    const double tol = tolerance(dtype, op, pattern, n, offset + i);
    if (!(std::fabs(got - want) <= tol)) {
      return std::string(dtypeName(dtype)) + " " + std::string(reduceOpName(op)) + " n=" +
             std::to_string(n) + " pattern " + std::to_string(pattern) + ": element " +
             std::to_string(offset + i) + " is " + std::to_string(got) + ", expected " +
             std::to_string(want) + " (tolerance " + std::to_string(tol) + ")";
    }
  }
  return "";
}

}  // namespace cofab::comm::testing
