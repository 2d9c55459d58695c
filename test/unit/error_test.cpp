#include <rdma/fi_errno.h>

#include <dma/error.hpp>

#include "../catch.hpp"

TEST_CASE("library errors carry their own messages in the dma category", "[errors]") {
  const std::error_code ec = dma::errc::progress_deadline;
  CHECK(std::string(ec.category().name()) == "dma");
  CHECK(ec.message().find("progress_deadline") != std::string::npos);
  CHECK(std::error_code(dma::errc::advertisement_hex).message() == "invalid hex in address");
}

TEST_CASE("libfabric codes read as fi_strerror in the libfabric category, from either sign", "[errors]") {
  const auto negative = dma::fabric_error(-FI_ECANCELED);
  const auto positive = dma::fabric_error(FI_ECANCELED);
  CHECK(negative == positive);
  CHECK(std::string(negative.category().name()) == "libfabric");
  CHECK(negative.message() == fi_strerror(FI_ECANCELED));
  CHECK(dma::fabric_error(-FI_EAVAIL).message() == fi_strerror(FI_EAVAIL));
}

TEST_CASE("peer failures, deadlines and bad advertisements fall into broad conditions", "[errors]") {
  CHECK(dma::fabric_error(FI_ECANCELED) == dma::condition::connection_lost);
  CHECK(dma::fabric_error(FI_ENOTCONN) == dma::condition::connection_lost);
  CHECK(dma::fabric_error(FI_ECONNREFUSED) == dma::condition::peer_unreachable);
  CHECK(dma::fabric_error(FI_EACCES) == dma::condition::remote_access_denied);
  CHECK(std::error_code(dma::errc::progress_deadline) == dma::condition::peer_unreachable);
  CHECK(std::error_code(dma::errc::connection_refused) == dma::condition::peer_unreachable);
  CHECK(std::error_code(dma::errc::connection_rejected) == dma::condition::peer_unreachable);
  CHECK(std::error_code(dma::errc::peer_unreachable) == dma::condition::peer_unreachable);
  CHECK(std::error_code(dma::errc::connection_lost) == dma::condition::connection_lost);
  CHECK_FALSE(std::error_code(dma::errc::connection_lost) == dma::condition::peer_unreachable);
  CHECK(std::error_code(dma::errc::remote_access_denied) == dma::condition::remote_access_denied);
  CHECK(std::error_code(dma::errc::address_port_zero) == dma::condition::invalid_advertisement);
  CHECK(std::error_code(dma::errc::no_source) == dma::condition::invalid_operand);
  CHECK(std::error_code(dma::errc::shutdown) == dma::condition::cancelled);
  CHECK_FALSE(std::error_code(dma::errc::shutdown) == dma::condition::peer_unreachable);
}

TEST_CASE("a rejected connection names the protocol mismatch and the key that fixes it", "[errors]") {
  const std::string message = std::error_code(dma::errc::connection_rejected).message();
  CHECK(message.find("wire protocols") != std::string::npos);
  CHECK(message.find("tcp_protocol = \"rxm\"") != std::string::npos);
  CHECK_FALSE(std::error_code(dma::errc::connection_rejected) == dma::condition::connection_lost);
}

TEST_CASE("a transfer's deadline compares equal to std::errc::timed_out and to nothing of the peer's", "[errors]") {
  const std::error_code ec = dma::errc::timed_out;
  CHECK(ec == std::errc::timed_out);
  CHECK_FALSE(ec == dma::condition::peer_unreachable);
  CHECK_FALSE(ec == dma::condition::cancelled);
}

TEST_CASE("small libfabric codes compare equal to the matching std::errc", "[errors]") {
  CHECK(dma::fabric_error(FI_ECANCELED) == std::errc::operation_canceled);
  CHECK(dma::fabric_error(FI_ETIMEDOUT) == std::errc::timed_out);
  CHECK(dma::fabric_error(-FI_EAGAIN) == std::errc::resource_unavailable_try_again);
  CHECK(dma::fabric_error(-FI_ENOMEM) == std::errc::not_enough_memory);
}

TEST_CASE("throw_if throws a system_error with the code and the text", "[errors]") {
  CHECK_NOTHROW(dma::throw_if({}, "nothing"));
  try {
    dma::throw_if(dma::errc::no_domain, "opening rdmap0");
    FAIL("no exception");
  } catch (const std::system_error& error) {
    CHECK(error.code() == dma::errc::no_domain);
    CHECK(std::string(error.what()).find("opening rdmap0") != std::string::npos);
  }
}
