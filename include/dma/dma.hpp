// Everything dma-libfabric offers, in one include.
#pragma once

#include <dma/config.hpp>

#include <dma/advertisement.hpp>
#include <dma/asynchronous.hpp>
#include <dma/checksum.hpp>
#include <dma/configuration.hpp>
#include <dma/endpoint.hpp>
#include <dma/error.hpp>
#include <dma/fabric_service.hpp>
#include <dma/memory_region.hpp>
#include <dma/peer_address.hpp>
#include <dma/pool.hpp>
#include <dma/target.hpp>
#include <dma/transfer.hpp>
