# Transport interfaces, the registry and every backend (one subfolder each).
list(APPEND COFAB_FABRIC_SOURCES
  transport/accept_queue.cc
  transport/inproc_pipe.cc
  transport/off_loop_runner.cc
  transport/registry.cc
  transport/loopback/loopback_connection.cc
  transport/loopback/loopback_context.cc
  transport/loopback/worker.cc
  transport/tcp/epoll_loop.cc
  transport/tcp/lingering_close.cc
  transport/tcp/socket_util.cc
  transport/tcp/striped_connection.cc
  transport/tcp/tcp_connection.cc
  transport/tcp/tcp_context.cc
  transport/tcp/tcp_listener.cc)
# rdma: verbs headers only (libibverbs is dlopen'd at run time, never linked).
if(COFAB_HAVE_RDMA)
  list(APPEND COFAB_FABRIC_SOURCES
    transport/rdma/qp_info.cc
    transport/rdma/rdma_context.cc
    transport/rdma/rdma_device.cc
    transport/rdma/rdma_endpoint.cc
    transport/rdma/rdma_memory_region.cc
    transport/rdma/rdma_worker.cc
    transport/rdma/verbs_api.cc)
endif()
# dpdk: kernel-bypass frames with its own reliability. rte_eth_from_rings (in-process ring
# ports) lives in the net_ring driver, which pkg-config's libdpdk does not list.
if(COFAB_HAVE_DPDK)
  list(APPEND COFAB_FABRIC_SOURCES
    transport/dpdk/conn.cc
    transport/dpdk/dpdk_context.cc
    transport/dpdk/eal.cc
    transport/dpdk/engine.cc
    transport/dpdk/frame.cc
    transport/dpdk/port.cc
    transport/dpdk/driver_traits.cc)
  list(APPEND COFAB_FABRIC_PRIVATE_DEPS PkgConfig::DPDK rte_net_ring)
endif()
