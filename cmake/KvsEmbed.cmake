# SPDX-License-Identifier: Apache-2.0
# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P KvsEmbed.cmake
# Writes OUT: `const unsigned char NAME[]` (16-byte aligned, as the driver
# wants a fatbin image) holding IN's bytes, and `const size_t NAME_size`.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n_hex)
math(EXPR n "${n_hex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){16})" "\\1\n    " body "${body}")
file(WRITE "${OUT}"
    "/* SPDX-License-Identifier: Apache-2.0 */\n"
    "/* Generated from ${IN} by cmake/KvsEmbed.cmake: do not edit. */\n"
    "#include <stddef.h>\n"
    "extern const unsigned char ${NAME}[];\n"
    "extern const size_t ${NAME}_size;\n"
    "__attribute__((aligned(16))) const unsigned char ${NAME}[] = {\n    ${body}\n};\n"
    "const size_t ${NAME}_size = ${n};\n")
