# Worker side of the aggregator protocol: PushPullClient, placement, protocol constants.
list(APPEND COFAB_FABRIC_SOURCES
  ps/aggregator_collectives.cc
  ps/daemon_directory.cc
  ps/ps_protocol.cc
  ps/push_pull_client.cc)
list(APPEND COFAB_FABRIC_SOURCES
  ps/model_client.cc)
