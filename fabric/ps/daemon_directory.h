// Where the aggregator daemons of a job are: cofab-aggd instance i of M writes its transport
// address under "<prefix>/server/<i>" and M under "<prefix>/count" in the job's Store
// (ps_protocol.h names the keys); every client (push-pull, model store, ...) reads them here.
// Blocking on the store until `deadline`; any thread.
#pragma once

#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "fabric/rendezvous/store.h"

namespace cofab::ps {

// The daemons' addresses, index = daemon id. DeadlineExceeded (with the hint to start cofab-aggd)
// when none registered in time; InvalidArgument when the count key holds nonsense.
StatusOr<std::vector<std::string>> discoverDaemons(Store& store, const std::string& prefix,
                                                   Deadline deadline);

// What a client's connect() uses: `listed` when it is not empty, else discoverDaemons(*store,
// prefix, deadline). With neither (no store, nothing listed): InvalidArgument naming `who`.
StatusOr<std::vector<std::string>> daemonAddresses(Store* store, const std::string& prefix,
                                                   const std::vector<std::string>& listed,
                                                   Deadline deadline, const std::string& who);

// What a client's connect() uses: daemonAddresses(), and when the daemons came from the store,
// a check of `chunkBytes` against the limit each published. A chunk larger than a daemon's
// --max-chunk-bytes is rejected, and one over twice that breaks the connection (the daemon's
// frame limit): the worker then looked like it lost the daemon, failed over, and both daemons
// counted it lost. So a chunk size above what any daemon published (those that publish
// nothing, older ones, are not checked) is InvalidArgument naming `who`, the option that set it
// (`chunkOption`) and the daemon.
StatusOr<std::vector<std::string>> findDaemons(Store* store, const std::string& prefix,
                                               const std::vector<std::string>& listed,
                                               size_t chunkBytes, Deadline deadline,
                                               const std::string& who,
                                               const std::string& chunkOption);

}  // namespace cofab::ps
