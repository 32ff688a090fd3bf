// ops/dspark_shape.h.
#include "ops/dspark_shape.h"

#include "core/error.h"

namespace df {

DSparkHeadShape dspark_head_shape(const DSparkHeadDims& d, int64_t nb) {
  DF_CHECK(d.block_size >= 2 && d.hidden >= 1 && d.vocab >= 1 && d.markov_rank >= 0 &&
               (!d.confidence_with_markov || d.markov_rank > 0),
           "dspark head: bad dims block %d hidden %d vocab %d markov_rank %d (confidence %d, with markov %d)",
           d.block_size, d.hidden, d.vocab, d.markov_rank, int(d.confidence), int(d.confidence_with_markov));
  DSparkHeadShape s;
  s.nb = nb;
  s.B = d.block_size;
  s.H = d.hidden;
  s.V = d.vocab;
  s.R = d.markov_rank;
  s.markov = d.markov_rank == 0                               ? DSparkMarkov::none
             : d.markov_head_type == DrafterMarkovHead::gated ? DSparkMarkov::gated
             : d.markov_head_type == DrafterMarkovHead::rnn   ? DSparkMarkov::rnn
                                                              : DSparkMarkov::vanilla;
  s.confidence = d.confidence;
  s.confidence_markov = d.confidence && d.confidence_with_markov;  // without a confidence head: no input
  return s;
}

}  // namespace df
