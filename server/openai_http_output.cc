#include "server/openai_http_output.h"

namespace thetaserve::server {
namespace {

// Appends a later delta of the same completion to `into`; the prompt's scores come once.
void AppendDelta(scheduler::TokenDelta& into, const scheduler::TokenDelta& d) {
  into.token_ids.insert(into.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
  into.text += d.text;
  into.logprobs.insert(into.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  into.top.insert(into.top.end(), d.top.begin(), d.top.end());
  if (d.prompt) into.prompt = d.prompt;
}

}  // namespace

void HttpOutput::Take(std::chrono::milliseconds timeout, std::vector<Taken>* taken) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return news_; });
  news_ = false;
  taken->resize(choices_.size());
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    Taken& t = (*taken)[i];
    t.delta = std::move(c.pending);
    c.pending = {};
    t.finished_now = c.finish.has_value() && !t.finish.has_value();
    t.finish = c.finish;
  }
}

void HttpOutput::Deliver(int index, const scheduler::TokenDelta& d) {
  std::lock_guard<std::mutex> lock(mu_);
  AppendDelta(choices_[index].pending, d);
  news_ = true;
  cv_.notify_one();
}

void HttpOutput::Finish(int index, const scheduler::FinishInfo& info) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[index].finish = info;
  news_ = true;
  cv_.notify_one();
}

void SharedPromptScores::Share(std::vector<HttpOutput::Taken>& taken) {
  for (size_t i = 0; i < taken.size(); i += per_prompt_) {
    if (taken[i].delta.prompt) scores_[i / per_prompt_] = taken[i].delta.prompt;
  }
  for (size_t i = 0; i < taken.size(); ++i) {
    if (i % per_prompt_ == 0 || given_[i]) continue;
    HttpOutput::Taken& t = taken[i];
    AppendDelta(held_[i], t.delta);
    const size_t first = i - i % per_prompt_;
    const std::shared_ptr<const scheduler::PromptScores>& scores = scores_[i / per_prompt_];
    // A failure is never held: it ends the call (ServiceSink cancels the others) at once.
    const bool failed = t.finish && Failed(*t.finish);
    if (!scores && !taken[first].finish && !failed) {
      // Hidden until released: HttpOutput::Take reports the end again (finished_now) while
      // `finish` is unset here.
      t.delta = {};
      t.finish.reset();
      t.finished_now = false;
      continue;
    }
    t.delta = std::move(held_[i]);
    held_[i] = {};
    t.delta.prompt = scores;
    given_[i] = true;
  }
}

const scheduler::FinishInfo* FirstFailure(const std::vector<HttpOutput::Taken>& taken) {
  for (const auto& t : taken) {
    if (t.finish && Failed(*t.finish)) return &*t.finish;
  }
  return nullptr;
}

}  // namespace thetaserve::server
