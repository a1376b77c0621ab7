# Trains each model of the export checks for a few steps on the fixture with the built cohort,
# exports it in both formats and writes cohort's own test-set logits (`eval --logits`), as
# OUT/<name>.{ckpt,safetensors,onnx,npy}. Run by ctest: cmake -DCOHORT=... -DDATA=... -DOUT=...
#   -P make_exports.cmake. Any failing command fails the test.
# Models (name; spec; steps), all at batch 64 in leaves of 16 rows on 2 workers:
#   mlp, cnn, resnet20  the peer's models (peer names); resnet20 (bn, residual blocks, gap) for 8
#                       steps (0.7 s of training on 2 cores): its running statistics, updated once
#                       per leaf, are then 32 updates away from their initial values, enough that
#                       its predictions spread over the classes (with leaves of 32 rows, 16
#                       updates, every test image gets the same class).
#   list                conv with stride and padding, avgpool, dropout (sequential names).
#   nobias              a conv without bias: Conv2d(..., bias=False), a two-input Conv in ONNX.
#   all                 every layer kind but flatten: conv with and without bias, bn after a conv
#                       and after a linear layer, relu, maxpool, avgpool, res with an identity and
#                       with a projection shortcut, gap, dropout, linear. A flatten after gap,
#                       whose output is flat already, does not train (an internal error building
#                       its plan), so flatten is exported by list, nobias and cnn.
set(models
    "mlp\;mlp:784-64-32-10\;30"
    "cnn\;cnn\;30"
    "resnet20\;resnet20\;8"
    "nobias\;conv(4,3,1,1,nobias)-relu-maxpool(2)-flatten-linear(10)\;30"
    "list\;conv(8,3,2,1)-relu-avgpool(2)-dropout(0.25)-conv(8,3,1,1)-relu-maxpool(2,1)-flatten-linear(32)-relu-linear(10)\;30"
    "all\;conv(8,3,1,1)-bn-relu-maxpool(2)-res(8)-res(16,2)-conv(16,3,1,1,nobias)-bn-relu-avgpool(2,1)-gap-dropout(0.25)-linear(32)-bn-relu-linear(10)\;30")
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
  list(GET entry 2 steps)
  set(base ${OUT}/${name})
  run(${COHORT} train --model ${spec} --data ${DATA} --steps ${steps} --batch 64 --micro-batch 16
      --workers 2 --warmup-steps 0 --quiet --save ${base}.ckpt)
  run(${COHORT} export --checkpoint ${base}.ckpt --format safetensors -o ${base}.safetensors)
  run(${COHORT} export --checkpoint ${base}.ckpt --format onnx -o ${base}.onnx)
  run(${COHORT} eval --checkpoint ${base}.ckpt --data ${DATA} --workers 2
      --summary ${base}.json --logits ${base}.npy)
  message(STATUS "${name}: ${spec} exported")
endforeach()
