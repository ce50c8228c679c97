// Uses installed cofab headers and libraries: a store round trip and a Status. Also compiles
// README.md's API sketch (readmeSketch: keep the two the same), which needs a launched job to run.
#include <cstdio>

#include "core/config.h"
#include "fabric/rendezvous/bootstrap.h"
#include "fabric/rendezvous/hash_store.h"

[[maybe_unused]] static cofab::Status readmeSketch() {
  COFAB_ASSIGN_OR_RETURN(auto boot, cofab::bootstrapFromEnv(cofab::Deadline::afterMs(30'000)));
  cofab::Store& store = *boot.store;  // shared by all ranks of the job
  int rank = boot.info.rank, world = boot.info.worldSize;

  COFAB_RETURN_IF_ERROR(store.set("addr/" + std::to_string(rank), cofab::toBytes("...")));
  COFAB_ASSIGN_OR_RETURN(cofab::Bytes peer,
                         store.get("addr/0", cofab::Deadline::afterMs(10'000)));  // waits
  COFAB_ASSIGN_OR_RETURN(int64_t arrived, store.add("barrier", 1));
  (void)world, (void)peer, (void)arrived;
  return cofab::OkStatus();
}

int main() {
  cofab::HashStore store;
  if (!store.set("hello", cofab::toBytes("world")).ok()) return 1;
  auto v = store.get("hello", cofab::Deadline::afterMs(100));
  if (!v.ok() || cofab::toString(*v) != "world") return 2;
  auto missing = store.get("absent", cofab::Deadline::afterMs(1));
  if (missing.ok() || missing.status().code() != cofab::StatusCode::kDeadlineExceeded) return 3;
  std::printf("consumer: cofab %s works (%s)\n", COFAB_VERSION, missing.status().toString().c_str());
  return 0;
}
