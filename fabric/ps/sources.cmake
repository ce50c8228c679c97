# Worker side of the aggregator protocol: PushPullClient, placement, protocol constants.
list(APPEND COFAB_FABRIC_SOURCES
  ps/ps_protocol.cc
  ps/push_pull_client.cc)
