"""Token forcing: prove that committed outputs are the stock target model's greedy argmax.

`verify(records, reference) -> Verdict` teacher-forces prompt + output through a reference
(the stock runtime in a worker process of its own, or any SGLang-compatible `/generate`
server) and checks every committed position and where each output ends.
"""
