// The build conditions under which some checks are left out. kAsan: whether this test binary is
// built with AddressSanitizer (GCC's __SANITIZE_ADDRESS__, clang's __has_feature): checks that
// depend on uninstrumented timing or on the allocator's behaviour are left out under it.
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

// Whether this test binary is compiled without optimization (the debug preset's -O0: GCC and
// clang define __OPTIMIZE__ from -O1 on): cohort's own kernels then run many times slower than
// oneDNN's, which come optimized from the library, so timing checks that compare the two are
// left out.
#if defined(__OPTIMIZE__)
inline constexpr bool kUnoptimized = false;
#else
inline constexpr bool kUnoptimized = true;
#endif

}  // namespace cohort::testing
