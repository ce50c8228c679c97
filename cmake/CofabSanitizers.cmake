# COFAB_SANITIZE=address,undefined or =thread applies to every target (and to GoogleTest's
# inline code), so that the whole suite runs instrumented.
if(COFAB_SANITIZE)
  if(COFAB_SANITIZE MATCHES "thread" AND COFAB_SANITIZE MATCHES "address")
    message(FATAL_ERROR "COFAB_SANITIZE: thread cannot be combined with address")
  endif()
  set(_san_flags -fsanitize=${COFAB_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX,C>:${_san_flags}>")
  add_link_options(-fsanitize=${COFAB_SANITIZE})
endif()
