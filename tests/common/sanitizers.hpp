// Whether this test binary is built with AddressSanitizer (GCC's __SANITIZE_ADDRESS__, clang's
// __has_feature): checks that depend on uninstrumented timing or on the allocator's behaviour
// are left out under it.
#pragma once

namespace cohort::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

}  // namespace cohort::testing
