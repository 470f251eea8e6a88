"""The tasks a model trains for, named once: the head follows the architecture, the dummy data
the head.
"""

from __future__ import annotations

# The task head follows the architecture; the dummy dataset follows the head.
SEQUENCE_CLASSIFICATION = "sequence classification"
CAUSAL_LM = "causal language modelling"
IMAGE_CLASSIFICATION = "image classification"
SEQ2SEQ = "sequence to sequence"
TOKEN_CLASSIFICATION = "token classification"  # a label per token: named entities, parts of speech
# A masked-LM head's own task: only a user's Trainer that trained one (`TRAINED_HEAD`); a config
# that names one trains its model type's task (the walkthrough's BERT classifies sequences).
MASKED_LM = "masked language modelling"
TASKS = (SEQUENCE_CLASSIFICATION, CAUSAL_LM, IMAGE_CLASSIFICATION, SEQ2SEQ, TOKEN_CLASSIFICATION,
         MASKED_LM)
# The config key under which a run's carried config names the head a user's Trainer trained
# where the config's own architecture would be read as a body (analysis/carried_model.py).
TRAINED_HEAD = "anatomy_trained_head"
# The tasks whose head is a classifier of the config's labels (`ModelSpec.num_labels`).
CLASSIFICATIONS = (SEQUENCE_CLASSIFICATION, IMAGE_CLASSIFICATION, TOKEN_CLASSIFICATION)
NUM_LABELS = 2  # the walkthrough's binary labels, for a classifier whose config names none
IMAGE_SIZE = 224  # what image classifiers train on when their config names no size
