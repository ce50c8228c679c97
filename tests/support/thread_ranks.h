// runThreadRanks: runs fn(rank) on `n` threads at once ("threads as ranks") and returns each
// rank's Status, so a test can assert on every rank. Threads are joined before returning.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace cofab::testing {

std::vector<Status> runThreadRanks(int n, const std::function<Status(int rank)>& fn);

// OK if every status is OK, else the first failure's code with every failure's message, each
// prefixed with its rank: one rank's failure often makes the others fail or wait, and the
// first rank to fail is not always the lowest.
Status allOk(const std::vector<Status>& statuses);

}  // namespace cofab::testing
