"""The HF Trainer on a tiny randomly initialised BERT (built from a config: no download), under torchrun:
`hf_trainer_watch.py MODE OUTPUT_DIR`.

MODE: ok | eval_main_only (the common hang: evaluate() on the main process only, after training) |
raise (rank 1 raises at step 5, in a callback)."""
import ddp_doctor

ddp_doctor.watch()

import sys

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

MODE, OUT = sys.argv[1], sys.argv[2]


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": i % 2}


class RaiseOnRank1(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if MODE == "raise" and state.global_step == 5 and args.process_index == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise


def main():
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                             max_steps=8, use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Data(),
                      eval_dataset=Data(), callbacks=[RaiseOnRank1()])
    trainer.train()
    if MODE == "eval_main_only" and trainer.is_world_process_zero():  # expect: main_only
        trainer.evaluate()


if __name__ == "__main__":
    main()
