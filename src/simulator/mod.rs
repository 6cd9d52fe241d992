//! A simulated LLM batch provider speaking the OpenAI Batch wire protocol (being built).
