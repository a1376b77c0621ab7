# Trains each model of the export checks for a few steps on the fixture with the built cohort,
# exports it in both formats and writes cohort's own test-set logits (`eval --logits`), as
# OUT/<name>.{ckpt,safetensors,onnx,npy}. Run by ctest: cmake -DCOHORT=... -DDATA=... -DOUT=...
#   -P make_exports.cmake. Any failing command fails the test.
# Models: the peer's mlp and cnn (peer names), and a layer list with every other layer kind
# (conv with stride and padding, avgpool, dropout; sequential names).
set(models
    "mlp\;mlp:784-64-32-10"
    "cnn\;cnn"
    "list\;conv(8,3,2,1)-relu-avgpool(2)-dropout(0.25)-conv(8,3,1,1)-relu-maxpool(2,1)-flatten-linear(32)-relu-linear(10)")
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "failed (${code}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
foreach(entry IN LISTS models)
  list(GET entry 0 name)
  list(GET entry 1 spec)
  set(base ${OUT}/${name})
  run(${COHORT} train --model ${spec} --data ${DATA} --steps 30 --batch 64 --workers 2
      --warmup-steps 0 --quiet --save ${base}.ckpt)
  run(${COHORT} export --checkpoint ${base}.ckpt --format safetensors -o ${base}.safetensors)
  run(${COHORT} export --checkpoint ${base}.ckpt --format onnx -o ${base}.onnx)
  run(${COHORT} eval --checkpoint ${base}.ckpt --data ${DATA} --workers 2
      --summary ${base}.json --logits ${base}.npy)
  message(STATUS "${name}: ${spec} exported")
endforeach()
