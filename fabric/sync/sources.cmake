# Training-sync algorithms (docs/SYNC.md).
list(APPEND COFAB_FABRIC_SOURCES
  sync/bsp_sync.cc
  sync/gossip_sync.cc
  sync/gradcode_sync.cc
  sync/ps_sync.cc
  sync/shadow_sync.cc
  sync/shared_model.cc
  sync/sync_algorithm.cc)
# The model and momentum loops run over the whole model every step.
cofab_hot_loops(sync/shared_model.cc)
