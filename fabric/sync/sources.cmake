# Training-sync algorithms (docs/SYNC.md). The model-store algorithms (ssp, easgd, eawild) need
# ps::ModelClient's implementation; until it is in the tree they report Unimplemented.
list(APPEND COFAB_FABRIC_SOURCES
  sync/bsp_sync.cc
  sync/gossip_sync.cc
  sync/shadow_sync.cc
  sync/shared_model.cc
  sync/sync_algorithm.cc)
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/ps/model_client.cc)
  list(APPEND COFAB_FABRIC_SOURCES sync/ps_sync.cc)
  set_source_files_properties(sync/shadow_sync.cc PROPERTIES
    COMPILE_DEFINITIONS COFAB_SYNC_HAVE_MODEL_STORE=1)
else()
  list(APPEND COFAB_FABRIC_SOURCES sync/ps_sync_unavailable.cc)
endif()
