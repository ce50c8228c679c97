// Uses installed cofab headers and libraries: a store round trip and a Status.
#include <cstdio>

#include "core/config.h"
#include "fabric/rendezvous/hash_store.h"

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
