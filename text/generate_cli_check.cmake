# twinstep-generate's text options (issue 14 item 5), run on the simulated device.
# cmake -DGENERATE=<exe> -DTOKENIZER=<dir> -P generate_cli_check.cmake
# --prompt "Hello" must generate exactly what --prompt-ids of its HF ids (<bos> Hello = 2,9259)
# generates, printed as the text of those ids; --chat must render, encode and run.
set(common --model gemma4-12b --device sim --max-tokens 12 --ignore-eos --tokenizer ${TOKENIZER})
execute_process(COMMAND ${GENERATE} ${common} --prompt "Hello"
                RESULT_VARIABLE rc_text OUTPUT_VARIABLE out_text ERROR_VARIABLE err_text)
execute_process(COMMAND ${GENERATE} ${common} --prompt-ids 2,9259
                RESULT_VARIABLE rc_ids OUTPUT_VARIABLE out_ids ERROR_VARIABLE err_ids)
if(NOT rc_text EQUAL 0 OR NOT rc_ids EQUAL 0)
  message(FATAL_ERROR "twinstep-generate failed: ${rc_text} ${err_text} / ${rc_ids} ${err_ids}")
endif()
if(NOT out_text STREQUAL out_ids)
  message(FATAL_ERROR "--prompt 'Hello' printed [${out_text}], --prompt-ids 2,9259 printed [${out_ids}]")
endif()
string(LENGTH "${out_text}" text_len)
if(text_len LESS 2)
  message(FATAL_ERROR "--prompt 'Hello' printed no text: [${out_text}]")
endif()
execute_process(COMMAND ${GENERATE} ${common} --chat --system "Be brief." --prompt "Hi there"
                RESULT_VARIABLE rc_chat OUTPUT_VARIABLE out_chat ERROR_VARIABLE err_chat)
if(NOT rc_chat EQUAL 0)
  message(FATAL_ERROR "--chat failed (${rc_chat}): ${err_chat}")
endif()
message(STATUS "twinstep-generate --prompt: [${out_text}]; --chat: [${out_chat}]")
