export { ApiError, Client, type ClientOptions, type RetryPolicy } from "./client.js";
export { work, type Answer, type Handler, type WorkOptions, type WorkStats } from "./worker.js";
export type * from "./types.js";
