# Training-sync algorithms (docs/SYNC.md).
list(APPEND COFAB_FABRIC_SOURCES
  sync/bsp_sync.cc
  sync/gossip_sync.cc
  sync/gradcode_sync.cc
  sync/ps_sync.cc
  sync/shadow_sync.cc
  sync/shared_model.cc
  sync/sync_algorithm.cc)
# The model and momentum loops run over the whole model every step: at -O2 GCC 12's very-cheap
# cost model leaves them scalar (they need an alias check); -O3 vectorises them
# (bench/sync/shared_model_bench; bench/RESULTS.md, "Session 6").
set_source_files_properties(sync/shared_model.cc PROPERTIES COMPILE_OPTIONS "-O3")
