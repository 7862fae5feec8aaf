# SPDX-License-Identifier: Apache-2.0
# Runs kvshare-worker as a user would and checks what two processes agree on:
# the same workload run twice, or split over two processes with --first,
# writes the same final logits, byte for byte.
#   cmake -DWORKER=<path to kvshare-worker> -DDIR=<scratch dir> -P cli_check.cmake
foreach(v WORKER DIR)
    if(NOT DEFINED ${v})
        message(FATAL_ERROR "${v} not set")
    endif()
endforeach()
file(MAKE_DIRECTORY ${DIR})
set(common --private --model small --system-tokens 90 --question-tokens 30 --decode 5 --json)

function(run_worker out_logits out_stdout)
    execute_process(COMMAND ${WORKER} ${common} ${ARGN} --logits-out ${out_logits}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "kvshare-worker ${ARGN} failed (${rc}): ${stderr}")
    endif()
    set(${out_stdout} "${stdout}" PARENT_SCOPE)
endfunction()

run_worker(${DIR}/a.bin out_a --requests 4)
run_worker(${DIR}/b.bin out_b --requests 4)
run_worker(${DIR}/c1.bin out_c1 --requests 2)
run_worker(${DIR}/c2.bin out_c2 --requests 2 --first 2)

file(SIZE ${DIR}/a.bin size_a)
if(NOT size_a EQUAL 4096) # 4 requests x 256 logits x 4 bytes
    message(FATAL_ERROR "a.bin holds ${size_a} bytes, not 4096")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${DIR}/a.bin ${DIR}/b.bin
                RESULT_VARIABLE same)
if(NOT same EQUAL 0)
    message(FATAL_ERROR "two runs of the same workload wrote different logits")
endif()
file(READ ${DIR}/c1.bin c1 HEX)
file(READ ${DIR}/c2.bin c2 HEX)
file(READ ${DIR}/a.bin a HEX)
if(NOT "${c1}${c2}" STREQUAL "${a}")
    message(FATAL_ERROR "a workload split over two processes wrote different logits")
endif()

# The JSON lines carry the same tokens and hashes in both runs (times differ).
foreach(out out_a out_b)
    string(REGEX MATCHALL "\"logits_hash\":\"[0-9a-f]+\",\"generated\":\\[[0-9,]*\\]"
           ${out}_fields "${${out}}")
endforeach()
list(LENGTH out_a_fields n)
if(NOT n EQUAL 4 OR NOT "${out_a_fields}" STREQUAL "${out_b_fields}")
    message(FATAL_ERROR "JSON outputs differ or are incomplete:\n${out_a}\n${out_b}")
endif()
if(NOT out_a MATCHES "\"summary\":{\"mode\":\"private\"")
    message(FATAL_ERROR "no summary line:\n${out_a}")
endif()
message(STATUS "kvshare-worker: 4 runs agree")
