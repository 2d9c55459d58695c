/// @file
/// Everything dma-libfabric offers, in one include.
#pragma once

#include <dma/config.hpp>

#include <dma/advertisement.hpp>
#include <dma/asynchronous.hpp>
#include <dma/checksum.hpp>
#include <dma/configuration.hpp>
#include <dma/endpoint.hpp>
#include <dma/error.hpp>
#include <dma/fabric_service.hpp>
#include <dma/log.hpp>
#include <dma/memory_region.hpp>
#include <dma/metrics.hpp>
#include <dma/notification.hpp>
#include <dma/peer_address.hpp>
#include <dma/pool.hpp>
#include <dma/target.hpp>
#include <dma/target_thread.hpp>
#include <dma/transfer.hpp>
#include <dma/version.hpp>

/// @namespace dma
/// dma-libfabric: server-initiated one-sided RMA (fi_writemsg / fi_readmsg) over libfabric, with an
/// Asio I/O object at its core (asynchronous::FabricService), a callback layer (FabricService) and
/// the passive peer (Target).

/// @namespace dma::asynchronous
/// The Asio form of the service: asynchronous::FabricService, whose submit() takes any completion
/// token.

/// @namespace dma::compat
/// Names that moved between Asio releases: `dma::compat::deferred` and `dma::compat::as_tuple` are
/// `asio::experimental::*` before Asio 1.24 and `asio::*` from 1.24 on.
